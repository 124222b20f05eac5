#!/usr/bin/env bash
# make run: the whole deployment on loopback with the embedded defaults —
# a private Ollama (built if missing), a generated tiny model, hearthd with an
# embedded Pebble state directory, and a fresh API key. Everything it writes
# stays under ./var; it touches no firewall and no authorized_keys.
set -euo pipefail
cd "$(dirname "$0")/.."

api_port=${HEARTH_PORT:-8080}
ollama_port=${HEARTH_OLLAMA_PORT:-11500}
model=${HEARTH_MODEL:-hearth-tiny}
var=$PWD/var

ollama_bin=$(scripts/ensure-ollama.sh)
mkdir -p "$var" bin
go build -o bin/ ./cmd/hearthd ./cmd/hearth-tinymodel
# The tiny model: random weights, real tokens; its chat template and
# parameters (num_predict caps a generation the model would never end).
params=$(bin/hearth-tinymodel -o "$var/tiny.gguf" -template "$var/tiny.template" -print-params)

bin/hearthd serve \
  --listen "127.0.0.1:$api_port" \
  --state-dir "$var/state" \
  --model "$model" --model-gguf "$var/tiny.gguf" --model-template "$var/tiny.template" $params \
  --ollama-start --ollama-bin "$ollama_bin" \
  --ollama-url "http://127.0.0.1:$ollama_port" \
  --ollama-models-dir "$var/ollama-models" \
  2> >(tee -a "$var/hearthd.log" >&2) &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT INT TERM

for _ in $(seq 1 240); do
  if curl -fsS "http://127.0.0.1:$api_port/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 $pid 2>/dev/null; then echo "hearthd exited; see $var/hearthd.log" >&2; exit 1; fi
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$api_port/readyz" >/dev/null || { echo "hearthd did not become ready" >&2; exit 1; }

key=$(bin/hearthd keys create --name "make-run" --state-dir "$var/state" | grep -o 'hearth_live_[A-Za-z0-9]*' | head -1)
url="http://127.0.0.1:$api_port/api/v1"
cat <<MSG

  hearth is running.
    deployment URL  $url
    model           $model
    API key         $key

  Try it:
    curl -sN $url/chat/completions \\
      -H "Authorization: Bearer $key" -H "Content-Type: application/json" \\
      -d '{"model":"$model","stream":true,"max_tokens":32,"messages":[{"role":"user","content":"Hello"}]}'

  Ctrl-C stops hearthd and its Ollama.
MSG
wait $pid
