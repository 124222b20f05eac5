package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"

	"github.com/hearthd/hearth/agent"
	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/deployapi"
	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/internal/sealbox"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/sshkeys"
)

// openEnforcement builds what keeps the host at its desired state: the
// firewall and the key writer, the one enforcer over them, and the agent
// that feeds it — following the control plane, or a local file
// (standalone).
func (nd *node) openEnforcement(ctx context.Context) error {
	cfg := nd.cfg
	fw, runFW, keys, err := enforcers(ctx, cfg, nd.log)
	if err != nil {
		return err
	}
	registerEnforcementMetrics(nd.m, fw, keys)
	nd.group.add(component{name: "firewall drift repair", phase: phaseBack, run: runFW})
	nd.enf = agent.NewEnforcer(agent.Concerns{Firewall: fw, SSHKeys: keys, APIKeys: managedKeys{nd.keys, nd.seal}, Runtime: nd.runtime}, nd.log)
	run := agent.NewStandalone(cfg.DesiredStateFile, nd.enf, nd.log, agent.StandaloneConfig{}).Run
	if cfg.ControlURL != "" {
		na, err := nodeAgent(cfg, nd.enf, nd.api, nd.keys, nd.m, nd.restarts.state, nd.log)
		if err != nil {
			return err
		}
		nd.agent = na
		nd.m.RegisterControlSync(na.LastSync)
		run = na.Run
	}
	nd.group.add(component{name: "enforcement", phase: phaseBack, run: run})
	return nil
}

// enforcers builds what applies the desired state on this host. The host's
// firewall is touched only when Firewall is enabled, and authorized_keys
// only when a user or file is configured, so dev modes change nothing.
func enforcers(ctx context.Context, cfg Config, log *slog.Logger) (firewall.Firewall, func(context.Context) error, sshkeys.Keys, error) {
	var fw firewall.Firewall = &firewall.Noop{}
	runFW := func(context.Context) error { return nil }
	if cfg.Firewall {
		cp, err := controlPlaneAddrs(ctx, cfg.ControlURL)
		if err != nil {
			return nil, nil, nil, err
		}
		nft, err := firewall.New(firewall.Config{ControlPlane: cp, Logger: log.With("component", "firewall")})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("firewall: %w", err)
		}
		fw, runFW = nft, nft.Run
	} else {
		log.Info("firewall enforcement off: rules are validated and reported, the host's nftables is not touched")
	}

	var keys sshkeys.Keys = unmanagedKeys{}
	if cfg.SSHUser != "" || cfg.AuthorizedKeysFile != "" {
		f, err := sshkeys.New(sshkeys.Config{User: cfg.SSHUser, Path: cfg.AuthorizedKeysFile, Logger: log.With("component", "sshkeys")})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("ssh keys: %w", err)
		}
		keys = f
	} else {
		log.Info("SSH keys not managed: no ssh-user or authorized-keys-file configured")
	}
	return fw, runFW, keys, nil
}

// unmanagedKeys validates keys like the real writer but writes nothing: the
// node was not told whose authorized_keys to manage.
type unmanagedKeys struct{}

func (unmanagedKeys) Sync(_ context.Context, keys []sshkeys.Key) error {
	for _, k := range keys {
		if _, err := sshkeys.Parse(k.PublicKey); err != nil {
			return fmt.Errorf("key %s: %w", k.ID, err)
		}
	}
	return nil
}

// controlPlaneAddrs resolves the control plane's address(es), which the
// firewall always lets the node reach.
func controlPlaneAddrs(ctx context.Context, controlURLs string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, one := range nodeapi.SplitURLs(controlURLs) {
		addrs, err := controlPlaneAddrsOf(ctx, one)
		if err != nil {
			return nil, err
		}
		out = append(out, addrs...)
	}
	return out, nil
}

// controlPlaneAddrsOf resolves one control plane URL.
func controlPlaneAddrsOf(ctx context.Context, controlURL string) ([]netip.AddrPort, error) {
	u, err := url.Parse(controlURL)
	if err != nil {
		return nil, fmt.Errorf("config control-url: %w", err)
	}
	hp, err := hostPort(controlURL)
	if err != nil {
		return nil, err
	}
	_, portStr, _ := net.SplitHostPort(hp)
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("config control-url: bad port %q", portStr)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", u.Hostname())
	if err != nil {
		return nil, fmt.Errorf("resolve control plane %s: %w", u.Hostname(), err)
	}
	out := make([]netip.AddrPort, 0, len(ips))
	for _, ip := range ips {
		out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(port)))
	}
	return out, nil
}

// nodeAgent builds the node agent when a control plane is configured,
// verifying the control plane's certificate as configured.
func nodeAgent(cfg Config, enf *agent.Enforcer, api *deployapi.API, keys *apikeys.Keyring, m *metrics.Node,
	restarts func() (bool, *nodeapi.RuntimeRestart), log *slog.Logger) (*agent.Node, error) {
	pins, _ := nodeapi.ParsePins(cfg.ControlCertSHA256) // checked by Validate
	hc, err := nodeapi.NewHTTPClient(nodeapi.TLS{CAFile: cfg.ControlCAFile, CertSHA256: pins})
	if err != nil {
		return nil, fmt.Errorf("config control-ca-file: %w", err)
	}
	return agent.NewNode(agent.NodeConfig{
		ControlURL:      cfg.ControlURL,
		HTTPClient:      hc,
		EnrollmentToken: cfg.EnrollmentToken,
		Hardware:        nodeapi.Hardware{Chip: cfg.NodeChip, RAM: cfg.NodeRAM, Storage: cfg.NodeStorage},
		CredentialPath:  filepath.Join(cfg.StateDir, "node", "credential.json"),
		OnReceive:       func(nodeapi.Desired) { m.DesiredStateReceived() },
		Usage:           func() []nodeapi.KeyUsage { return managedUsage(keys) },
		UsageBuckets: func(limit int) ([]nodeapi.UsageBucket, bool, error) {
			if err := keys.SealUsage(false); err != nil {
				return nil, false, err
			}
			return keys.PendingUsage(limit)
		},
		UsageAccepted:   keys.AckUsage,
		ModelInfo:       api.ModelInfo,
		RuntimeRestarts: restarts,
	}, enf, api.Healthy, log), nil
}

// managedKeys is the key ring as the enforcer's API keys concern: the
// desired state's keys, in the key ring's terms. The wipe also replaces
// the node's sealing key, so that nothing the last tenant was handed
// sealed (its reasoning items) opens for the next.
type managedKeys struct {
	k    *apikeys.Keyring
	seal *sealbox.Box
}

func (m managedKeys) SetManaged(_ context.Context, keys []nodeapi.APIKey) error {
	out := make([]apikeys.Managed, len(keys))
	for i, k := range keys {
		out[i] = apikeys.Managed{ID: k.ID, Name: k.Name, SHA256: k.Hash, ExpiresAt: k.ExpiresAt,
			RequestsPerMinute: k.RequestsPerMinute, TokensPerMinute: k.TokensPerMinute}
	}
	return m.k.SetManaged(out)
}

func (m managedKeys) Wipe(context.Context) error {
	if err := m.seal.Rotate(); err != nil {
		return fmt.Errorf("wipe: %w", err)
	}
	return m.k.Wipe()
}

// managedUsage is the usage of every managed key, for the report.
func managedUsage(k *apikeys.Keyring) []nodeapi.KeyUsage {
	var out []nodeapi.KeyUsage
	for _, key := range k.List() {
		if key.Source != apikeys.SourceManaged {
			continue
		}
		out = append(out, nodeapi.KeyUsage{ID: key.ID, Requests: uint64(key.Usage.Requests),
			PromptTokens: uint64(key.Usage.PromptTokens), CompletionTokens: uint64(key.Usage.CompletionTokens),
			LastUsedAt: key.LastUsedAt})
	}
	return out
}

// registerEnforcementMetrics exports the firewall's and the key writer's
// counters when they keep any.
func registerEnforcementMetrics(m *metrics.Node, fw firewall.Firewall, keys sshkeys.Keys) {
	if s, ok := fw.(interface{ Stats() firewall.Stats }); ok {
		m.RegisterFirewall(func() metrics.FirewallStats { return metrics.FirewallStats(s.Stats()) })
	}
	if s, ok := keys.(interface{ Stats() sshkeys.Stats }); ok {
		m.RegisterSSHKeys(func() metrics.SSHKeyStats { return metrics.SSHKeyStats(s.Stats()) })
	}
}
