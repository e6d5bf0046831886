#!/bin/bash
# Renders every kustomize overlay under k8s/overlays and validates it offline:
# strict schemas (k8s/validate/validate.mjs: TypeScript over the
# kubernetes-models types plus their JSON schemas) and cross-object
# consistency against the real binaries (k8s/validate/consistency.mjs). Also
# shows both validators fail on a typo'd field and an unknown flag.
#   usage: k8s_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src=$1
bin=$2
command -v kubectl > /dev/null || { echo "kubectl not found: it renders the overlays (kubectl kustomize)"; exit 1; }
command -v npm > /dev/null || { echo "npm not found: make deps installs nodejs"; exit 1; }
cd "$src/k8s/validate"
# Pinned by package-lock.json; installed once per checkout.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
overlays=()
for dir in "$src"/k8s/overlays/*/; do
  name=$(basename "$dir")
  kubectl kustomize "$dir" > "$out/$name.yaml"
  objects=$(grep -c '^kind:' "$out/$name.yaml")
  echo "rendered overlay $name: $objects objects"
  [ "$objects" -ge 10 ] || { echo "overlay $name rendered only $objects objects"; exit 1; }
  overlays+=("$out/$name.yaml")
done
[ "${#overlays[@]}" -eq 5 ] || { echo "expected overlays autoscaling, dev, ha, prod, node-local"; exit 1; }
node validate.mjs "${overlays[@]}"
node consistency.mjs "$bin" "${overlays[@]}"

# The checks can fail: a misspelt field, a wrong type, an unknown flag.
sed 's/^  replicas: 1$/  replicass: 1/' "$out/dev.yaml" > "$out/typo.yaml"
sed 's/periodSeconds: 5$/periodSeconds: "5s"/' "$out/dev.yaml" > "$out/type.yaml"
sed 's/--journal_dir=/--journal_dirr=/' "$out/dev.yaml" > "$out/flag.yaml"
if node validate.mjs "$out/typo.yaml" > "$out/log" 2>&1; then echo "validate.mjs accepted replicass"; exit 1; fi
grep -q "'\"replicass\"' does not exist" "$out/log" || { cat "$out/log"; exit 1; }
sed 's/averageValue: "1"$/averageValu: "1"/' "$out/autoscaling.yaml" > "$out/hpa.yaml"
if node validate.mjs "$out/hpa.yaml" > "$out/log" 2>&1; then echo "validate.mjs accepted averageValu"; exit 1; fi
grep -q "averageValu" "$out/log" || { cat "$out/log"; exit 1; }
if node validate.mjs "$out/type.yaml" > "$out/log" 2>&1; then echo "validate.mjs accepted a string periodSeconds"; exit 1; fi
grep -q "periodSeconds must be integer" "$out/log" || { cat "$out/log"; exit 1; }
if node consistency.mjs "$bin" "$out/flag.yaml" > "$out/log" 2>&1; then echo "consistency.mjs accepted --journal_dirr"; exit 1; fi
grep -q "sluice-coordinator has no flag --journal_dirr" "$out/log" || { cat "$out/log"; exit 1; }
# TLS layouts that cannot work: the kubelet's plaintext probe at a TLS
# listener, and data servers registering in plaintext with a TLS coordinator.
sed 's/port: 7073$/port: 7071/; /--health_listen=0.0.0.0:7073/d' "$out/prod.yaml" > "$out/probe.yaml"
if node consistency.mjs "$bin" "$out/probe.yaml" > "$out/log" 2>&1; then echo "consistency.mjs accepted a probe at a TLS listener"; exit 1; fi
grep -q "readinessProbe asks the TLS listener" "$out/log" || { cat "$out/log"; exit 1; }
sed '/--coordinator_ca=/d' "$out/prod.yaml" > "$out/register.yaml"
if node consistency.mjs "$bin" "$out/register.yaml" > "$out/log" 2>&1; then echo "consistency.mjs accepted plaintext registration with a TLS coordinator"; exit 1; fi
grep -q "the data servers register in plaintext" "$out/log" || { cat "$out/log"; exit 1; }
# No overlay ships a secret value, and the checker refuses one that does.
for rendered in "${overlays[@]}"; do
  if grep -q '^kind: Secret$' "$rendered"; then echo "$(basename "$rendered") renders a Secret"; exit 1; fi
done
{ cat "$out/prod.yaml"; printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: sluice-lease-secret\nstringData:\n  secret: leaked\n'; } > "$out/secret.yaml"
if node consistency.mjs "$bin" "$out/secret.yaml" > "$out/log" 2>&1; then echo "consistency.mjs accepted a rendered Secret"; exit 1; fi
grep -q "Secret/sluice-lease-secret: a rendered Secret ships its value" "$out/log" || { cat "$out/log"; exit 1; }
echo "k8s: every overlay renders, validates strictly and is consistent"
