#!/usr/bin/env bash
# make run: the whole product on loopback — hearth-control (the management
# API) and one enrolled hearthd node, each with its embedded Pebble state; a
# private Ollama supervised by hearthd (built if missing) with a generated
# tiny model; a deployment server and an API key created through the
# management API, as a customer would. Everything it writes stays under
# ./var and ./bin: no firewall rules, no authorized_keys (hearthd's
# firewall is off and SSH keys are unmanaged unless asked for).
# It runs until Ctrl-C (or SIGTERM), which stops everything.
#
# Each run starts from a fresh control plane and node state (var/control,
# var/state); models stay cached in var/ollama-models. Ports: HEARTH_PORT
# (deployment API, 8080), HEARTH_CONTROL_PORT (management API, 8400),
# HEARTH_OLLAMA_PORT (11500), HEARTH_METRICS_PORT and
# HEARTH_CONTROL_METRICS_PORT (9464, 9465). HEARTH_RUN_DIR and HEARTH_BIN_DIR
# move var/ and bin/.
set -euo pipefail
cd "$(dirname "$0")/.."

api_port=${HEARTH_PORT:-8080}
control_port=${HEARTH_CONTROL_PORT:-8400}
ollama_port=${HEARTH_OLLAMA_PORT:-11500}
metrics_port=${HEARTH_METRICS_PORT:-9464}
control_metrics_port=${HEARTH_CONTROL_METRICS_PORT:-9465}
model=${HEARTH_MODEL:-hearth-tiny}
var=${HEARTH_RUN_DIR:-$PWD/var}
bin=${HEARTH_BIN_DIR:-$PWD/bin}

ollama_bin=$(scripts/ensure-ollama.sh)
mkdir -p "$var" "$bin"
go build -o "$bin/" ./cmd/hearthd ./cmd/hearth-control ./cmd/hearth ./cmd/hearth-tinymodel
# The tiny model: random weights, real tokens; its chat template and
# parameters (num_predict caps a generation the model would never end).
params=$("$bin/hearth-tinymodel" -o "$var/tiny.gguf" -template "$var/tiny.template" -print-params)

rm -rf "$var/control" "$var/state"
control_url="http://127.0.0.1:$control_port"
deployment_url="http://127.0.0.1:$api_port/api/v1"

# Children stop with this script, however it ends; hearthd takes its
# Ollama down with it.
pids=()
stop() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop EXIT
trap 'exit 130' INT TERM

fail() { echo "make run: $*" >&2; exit 1; }

# wait_for WHAT PID CMD…: retry CMD every half second for two minutes
# while PID lives.
wait_for() {
  local what=$1 pid=$2; shift 2
  for _ in $(seq 1 240); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    kill -0 "$pid" 2>/dev/null || fail "$what: the process exited; see the log in $var"
    sleep 0.5
  done
  fail "$what: not within two minutes; see the log in $var"
}

# The control plane, with a management API token made before it starts.
token=$("$bin/hearth-control" tokens create --project default --name make-run --state-dir "$var/control" 2>/dev/null)
# Each daemon runs with the environment its systemd unit gives it.
mapfile -t control_env < <(sed -n 's/^Environment=//p' systemd/hearth-control.service)
env "${control_env[@]}" "$bin/hearth-control" serve \
  --listen "127.0.0.1:$control_port" \
  --state-dir "$var/control" \
  --metrics-listen "127.0.0.1:$control_metrics_port" \
  --public-deployment-url-template "$deployment_url" \
  2> >(tee -a "$var/hearth-control.log" >&2) &
pids+=($!)
ctl_pid=$!
wait_for "hearth-control" "$ctl_pid" curl -fsS "$control_url/v1/openapi.json"

# The node, enrolled with a one-time token.
enroll=$("$bin/hearth-control" enrollment-tokens create --uses 1 --ttl 1h --state-dir "$var/control" 2>/dev/null)
mapfile -t unit_env < <(sed -n 's/^Environment=//p' systemd/hearthd.service)
# The console's playground calls the deployment API from the console's
# origin: the node allows it where hearthd can (cors-allowed-origins).
cors=()
if "$bin/hearthd" serve --help 2>&1 | grep -q -- '-cors-allowed-origins '; then
  cors=(--cors-allowed-origins "$control_url")
fi
# shellcheck disable=SC2086 # $params is a list of flags
env "${unit_env[@]}" "$bin/hearthd" serve \
  --listen "127.0.0.1:$api_port" \
  --metrics-listen "127.0.0.1:$metrics_port" \
  --state-dir "$var/state" \
  --model "$model" --model-gguf "$var/tiny.gguf" --model-template "$var/tiny.template" $params \
  --ollama-start --ollama-bin "$ollama_bin" \
  --ollama-url "http://127.0.0.1:$ollama_port" \
  --ollama-models-dir "$var/ollama-models" \
  --control-url "$control_url" --enrollment-token "$enroll" \
  --node-chip cpu --node-ram 8 --node-storage 40 "${cors[@]}" \
  2> >(tee -a "$var/hearthd.log" >&2) &
pids+=($!)
node_pid=$!
wait_for "hearthd" "$node_pid" curl -fsS "http://127.0.0.1:$api_port/readyz"

# mgmt METHOD PATH [BODY]: a management API call.
mgmt() {
  curl -fsS -X "$1" "$control_url$2" -H "Authorization: Bearer $token" -H "Content-Type: application/json" ${3:+-d "$3"}
}
# field NAME: a string field of the JSON on stdin.
field() { grep -o "\"$1\":\"[^\"]*\"" | head -1 | cut -d'"' -f4; }

# A deployment server, as a customer rents one: the node serves the model
# it orders.
server=""
for _ in $(seq 1 60); do # until the node has joined the pool
  if server=$(mgmt POST /v1/servers "{\"name\":\"demo\",\"chip\":\"cpu\",\"ram\":4,\"storage\":20,\"stack\":\"deployment\",\"model\":\"$model\",\"billing\":\"monthly\"}" 2>/dev/null); then break; fi
  sleep 0.5
done
server_id=$(field id <<<"$server")
[ -n "$server_id" ] || fail "could not create the deployment server"
server_url=$(field deployment_url <<<"$server")
running() { mgmt GET "/v1/servers/$server_id" | grep -q '"status":"running"'; }
wait_for "server $server_id running" "$node_pid" running

key=$(mgmt POST "/v1/servers/$server_id/api-keys" '{"name":"make-run"}' | field key)
[ -n "$key" ] || fail "could not create an API key"
key_works() { curl -fsS "$server_url/models" -H "Authorization: Bearer $key"; }
wait_for "the API key on the node" "$node_pid" key_works
# The web console, signed in through a one-time link the admin socket
# issues for the token.
link=$(curl -fsS --unix-socket "$var/control/admin.sock" -X POST http://admin/console/sign-in-links \
  -H "Authorization: Bearer $token" | field path)
[ -n "$link" ] || fail "could not issue a console sign-in link"

cat <<MSG

  hearth is running.
    management API  $control_url/v1   (token $token)
    web console     $control_url$link
                    (a one-time sign-in link, valid 10 minutes; then $control_url/console/ with the token)
    server          $server_id
    deployment URL  $server_url
    model           $model
    API key         $key

  Try it:
    curl -sN $server_url/chat/completions \\
      -H "Authorization: Bearer $key" -H "Content-Type: application/json" \\
      -d '{"model":"$model","stream":true,"max_tokens":32,"messages":[{"role":"user","content":"Hello"}]}'

    curl -s $control_url/v1/servers/$server_id -H "Authorization: Bearer $token"

    export HEARTH_URL=$control_url HEARTH_TOKEN=$token
    $bin/hearth server get demo                      # the customer CLI (README: Manage your deployments)

  Ctrl-C stops the control plane, hearthd and its Ollama.
MSG
# Either daemon ending ends the run (the trap stops the other).
wait -n "$ctl_pid" "$node_pid" || true
