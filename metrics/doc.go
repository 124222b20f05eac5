// Package metrics holds hearth's Prometheus collectors and their names.
//
// Two sets exist: Node, exported by hearthd on each rented server, and
// Control, exported by the control plane. Each owns its own
// *prometheus.Registry (with the Go and process collectors on it), so
// nothing lives in package-level state and every test builds exactly the
// metrics it inspects.
//
// Naming follows the Prometheus conventions: every name starts with
// "hearth_", carries its base unit (_seconds, _bytes), counters end in
// _total, and timestamps end in _timestamp_seconds. Label values come from
// small fixed sets: unknown routes, methods and finish reasons are folded
// into "other", and reason labels take only the caller's own constants.
//
// Hot-path methods (Node.Request, Node.ObserveTTFT, …) are lock-free and do
// not allocate once a label combination has been seen: client_golang's
// counters and histograms are atomic, and label children are resolved once
// and cached in copy-on-write maps.
//
// Values owned by other packages (firewall and SSH key statistics, queue
// depth, runtime health) are read at scrape time through functions the
// caller registers, so metrics imports no other hearth package.
package metrics
