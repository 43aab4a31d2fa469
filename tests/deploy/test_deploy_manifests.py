"""Checks of the deployment artefacts: Dockerfile, deploy/compose.yaml and its
configs, the kustomize tree under deploy/k8s.

The heavy lifting (hadolint, kubectl kustomize + kubernetes-validate, compose
config, promtool) is scripts/check_deploy.sh; the tests below add cheap,
project-specific assertions that no generic linter knows about.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = ROOT / "Dockerfile"
CHECK_SCRIPT = ROOT / "scripts" / "check_deploy.sh"
EXIT_TOOLS_MISSING = 77

# The settings specserve reads from the environment. Every SPECSERVE_* name used
# by the deployment files must be one of them (a typo would be silently ignored).
# TODO(lead): read these from the gateway's settings class once it lands.
SUPPORTED_SETTINGS = frozenset(
    {
        "SPECSERVE_HOST",
        "SPECSERVE_PORT",
        "SPECSERVE_MODEL",
        "SPECSERVE_DRAFT_MODEL",
        "SPECSERVE_DRAFT_QUANTIZATION",
        "SPECSERVE_DEVICE",
        "SPECSERVE_DTYPE",
        "SPECSERVE_MAX_RUNNING",
        "SPECSERVE_MAX_SEQ_LEN",
        "SPECSERVE_NUM_KV_BLOCKS",
        "SPECSERVE_MAX_WAITING",
        "SPECSERVE_SPECULATION",
        "SPECSERVE_SPEC_K",
        "SPECSERVE_K_MAX",
        "SPECSERVE_REDIS_URL",
        "SPECSERVE_API_KEYS",
        "SPECSERVE_API_KEYS_FILE",
        "SPECSERVE_ADMIN_KEY",
        "SPECSERVE_RATE_LIMIT_RPM",
        "SPECSERVE_RATE_LIMIT_TPM",
        "SPECSERVE_REQUEST_TTL_S",
        "SPECSERVE_STORE_PROMPTS",
        "SPECSERVE_OTLP_ENDPOINT",
        "SPECSERVE_DRAIN_TIMEOUT_S",
        "SPECSERVE_KEEPALIVE_S",
        "SPECSERVE_MAX_BODY_BYTES",
        "SPECSERVE_LOG_LEVEL",
        # Also a GatewaySettings field. The image installs the package non-editably, where the
        # bundled-pair detection (a path under the repo root) cannot match, so the id is set explicitly.
        "SPECSERVE_SERVED_MODEL_NAME",
    }
)
SETTING_NAME = re.compile(r"\bSPECSERVE_[A-Z0-9_]+")

KUSTOMIZATIONS = ["base", "overlays/cpu", "overlays/gpu", "overlays/cpu-monitoring"]


# ----------------------------------------------------------------- the script ---


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_check_deploy_script_passes():
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(CHECK_SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    if proc.returncode == EXIT_TOOLS_MISSING:
        missing = [line for line in output.splitlines() if line.startswith("TOOLS MISSING")]
        pytest.skip("scripts/check_deploy.sh could not install its tools: " + "; ".join(missing))
    assert proc.returncode == 0, f"scripts/check_deploy.sh failed (exit {proc.returncode}):\n{output}"
    assert "deploy checks: all passed" in output


# ----------------------------------------------------------------- Dockerfile ---


def _stages(text: str) -> dict[str, list[str]]:
    """Dockerfile instructions (continuation lines joined) grouped by stage name."""
    logical, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        buf += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            logical.append(buf)
            buf = ""
    stages: dict[str, list[str]] = {}
    current = None
    for instr in logical:
        if instr.upper().startswith("FROM "):
            m = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", instr, re.IGNORECASE)
            current = (m.group(1) if m and m.group(1) else f"stage{len(stages)}").lower()
            stages[current] = [instr]
        elif current is not None:
            stages[current].append(instr)
    return stages


def _instr(stage: list[str], keyword: str) -> list[str]:
    return [i for i in stage if i.split(None, 1)[0].upper() == keyword]


def test_dockerfile_is_multistage_with_cpu_default_and_gpu_target():
    stages = _stages(DOCKERFILE.read_text())
    assert len(stages) >= 3, stages.keys()
    assert list(stages)[-1] == "cpu", "the last stage (docker build's default target) must be the CPU image"
    assert "gpu" in stages
    assert any("COPY --from=" in i for s in ("cpu", "gpu") for i in stages[s]), (
        "runtime stages copy the virtual environment from a builder stage"
    )
    text = DOCKERFILE.read_text()
    assert "python:3.11-slim" in text
    assert re.search(r"ARG CUDA_IMAGE=nvidia/cuda:\S+", text)


# ids avoid the bare keyword "gpu": tests/conftest.py skips those without CUDA.
@pytest.mark.parametrize("stage_name", ["cpu", "gpu"], ids=["cpu_stage", "cuda_stage"])
def test_runtime_stage_runs_as_non_root_with_healthcheck(stage_name):
    stage = _stages(DOCKERFILE.read_text())[stage_name]
    users = _instr(stage, "USER")
    assert users, f"{stage_name}: no USER"
    user = users[-1].split(None, 1)[1].split(":")[0]
    assert user not in {"root", "0"}, f"{stage_name}: runs as {user}"
    (healthcheck,) = _instr(stage, "HEALTHCHECK")
    assert "/health" in healthcheck and "urllib" in healthcheck and "curl" not in healthcheck
    (entrypoint,) = _instr(stage, "ENTRYPOINT")
    assert '["specserve", "serve"]' in entrypoint
    assert any("assets/models" in i for i in _instr(stage, "COPY")), "the bundled model pair is in the image"
    assert any("8000" in i for i in _instr(stage, "EXPOSE"))


@pytest.mark.parametrize("builder", ["cpu-builder", "gpu-builder"])
def test_builder_installs_pinned_torch_before_the_package(builder):
    runs = _instr(_stages(DOCKERFILE.read_text())[builder], "RUN")
    torch_at = next(i for i, r in enumerate(runs) if '"torch==${TORCH_VERSION}"' in r)
    package_at = next(i for i, r in enumerate(runs) if re.search(r"pip install .*\s\.$", r))
    venv_at = next(i for i, r in enumerate(runs) if "-m venv" in r)
    assert venv_at < torch_at < package_at
    assert "--index-url" in runs[torch_at]
    if builder == "cpu-builder":
        assert "https://download.pytorch.org/whl/cpu" in DOCKERFILE.read_text()


def test_dockerignore_keeps_the_context_small_but_keeps_what_the_build_copies():
    patterns = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for excluded in (".venv", ".git", ".train_work", "bench/results", ".pytest_cache", "tests"):
        assert excluded in patterns, excluded
    for needed in ("assets", "assets/models", "engine", "gateway", "policies", "pyproject.toml", "README.md"):
        assert needed not in patterns, needed


# ------------------------------------------------------------ setting names ---


def _deploy_files() -> list[Path]:
    files = [DOCKERFILE, ROOT / "docs" / "deploy.md"]
    files += [p for p in DEPLOY.rglob("*") if p.is_file()]
    return [p for p in files if p.exists()]


def test_every_specserve_setting_used_is_supported():
    unknown = {}
    for path in _deploy_files():
        for name in set(SETTING_NAME.findall(path.read_text())) - SUPPORTED_SETTINGS:
            unknown.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not unknown, f"unsupported SPECSERVE_* settings: {unknown}"


def test_supported_settings_are_gateway_settings_fields():
    """Cross-check of the list above against the real settings class, where it imports."""
    settings = pytest.importorskip("gateway.settings")
    prefix = settings.GatewaySettings.model_config.get("env_prefix", "")
    fields = {f"{prefix}{name}".upper() for name in settings.GatewaySettings.model_fields}
    assert prefix == "SPECSERVE_"
    assert fields >= SUPPORTED_SETTINGS, sorted(SUPPORTED_SETTINGS - fields)


# -------------------------------------------------------------------- compose ---


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_has_the_stack_and_specserve_env():
    services = _compose()["services"]
    assert set(services) >= {"specserve", "redis", "otel-collector", "jaeger", "prometheus"}
    env = services["specserve"]["environment"]
    assert env["SPECSERVE_REDIS_URL"] == "redis://redis:6379/0"
    assert env["SPECSERVE_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert env["SPECSERVE_HOST"] == "0.0.0.0"
    assert "8000:8000" in services["specserve"]["ports"]
    grace = int(services["specserve"]["stop_grace_period"].rstrip("s"))
    assert grace > int(env["SPECSERVE_DRAIN_TIMEOUT_S"])
    build = services["specserve"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    for name, svc in services.items():
        assert "image" in svc, f"{name}: pin an image"
        assert not svc["image"].endswith(":latest"), name
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).is_file(), f"{name}: {source} does not exist"
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{name} depends on unknown {dep}"


def test_prometheus_scrapes_specserve_metrics():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    job = jobs["specserve"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert [t for sc in job["static_configs"] for t in sc["targets"]] == ["specserve:8000"]


def test_otel_collector_pipelines_reference_defined_components():
    config = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text())
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    service = config["service"]
    assert set(service.get("extensions", [])) <= set(config.get("extensions", {}))
    assert "traces" in service["pipelines"]
    for name, pipeline in service["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(kind, [])) <= set(config.get(kind, {})), f"{name}.{kind}"
    jaeger_exporters = [
        e for e in service["pipelines"]["traces"]["exporters"] if "jaeger" in config["exporters"][e].get("endpoint", "")
    ]
    assert jaeger_exporters, "traces go to Jaeger"


# ----------------------------------------------------------------- kubernetes ---


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (scripts/check_deploy.sh installs it)")
    version = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True)
    kustomize = re.match(r"v(\d+)\.", json.loads(version.stdout or "{}").get("kustomizeVersion", ""))
    if not kustomize or int(kustomize.group(1)) < 4:
        pytest.skip("kubectl embeds no kustomize v4+ (components, labels)")
    out = {}
    for name in KUSTOMIZATIONS:
        proc = subprocess.run([kubectl, "kustomize", str(K8S / name)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"kubectl kustomize {name}: {proc.stderr}"
        out[name] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return out


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _server(docs: list[dict]) -> tuple[dict, dict, dict[str, str]]:
    deployment = _one(docs, "Deployment", "specserve")
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "specserve"]
    (cm_ref,) = [e["configMapRef"]["name"] for e in container["envFrom"]]
    config = _one(docs, "ConfigMap", cm_ref)["data"]
    return deployment, container, config


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_deployment_probes_drain_and_keys(rendered, name):
    docs = rendered[name]
    deployment, container, config = _server(docs)
    pod = deployment["spec"]["template"]["spec"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    # /health is 200 while the model loads; the startup probe waits for /ready instead.
    assert container["startupProbe"]["httpGet"]["path"] == "/ready"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "model loading needs time"

    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = int(config["SPECSERVE_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + drain

    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container.get("env", []) if "valueFrom" in e}
    assert secrets["SPECSERVE_API_KEYS"] == {"name": "specserve-keys", "key": "api-keys"}
    assert secrets["SPECSERVE_ADMIN_KEY"] == {"name": "specserve-keys", "key": "admin-key"}
    assert not [d for d in docs if d["kind"] == "Secret"], "no keys in the manifests"

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    assert config["SPECSERVE_HOST"] == "0.0.0.0"
    assert not set(config) - SUPPORTED_SETTINGS - {"HF_HOME", "HF_HUB_OFFLINE"}


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_service_pdb_hpa_and_redis_fit_together(rendered, name):
    docs = rendered[name]
    deployment, container, config = _server(docs)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]

    service = _one(docs, "Service", "specserve")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == 8000 and port["targetPort"] in ("http", 8000)
    assert int(config["SPECSERVE_PORT"]) == container["ports"][0]["containerPort"] == 8000

    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = _one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "specserve"}
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["minReplicas"] >= 2, "a drain or a disruption must leave a replica serving"
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"

    redis_host = re.match(r"redis://([^:/]+):6379/\d+$", config["SPECSERVE_REDIS_URL"]).group(1)
    redis_sts = _one(docs, "StatefulSet")
    redis_svc = _one(docs, "Service", redis_host)
    assert redis_svc["spec"]["selector"].items() <= redis_sts["spec"]["template"]["metadata"]["labels"].items()


def test_servicemonitor_only_in_its_component(rendered):
    for name in ("base", "overlays/cpu", "overlays/gpu"):
        assert not [d for d in rendered[name] if d["kind"] == "ServiceMonitor"], name
    docs = rendered["overlays/cpu-monitoring"]
    monitor = _one(docs, "ServiceMonitor")
    service = _one(docs, "Service", "specserve")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_cpu_overlay_serves_the_bundled_pair(rendered):
    _, container, config = _server(rendered["overlays/cpu"])
    assert config["SPECSERVE_MODEL"] == "/app/assets/models/target"
    assert config["SPECSERVE_DRAFT_MODEL"] == "/app/assets/models/draft"
    assert config["SPECSERVE_DEVICE"] == "cpu"
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert not container["image"].endswith("-cuda")


def test_gpu_overlay(rendered):
    docs = rendered["overlays/gpu"]
    deployment, container, config = _server(docs)
    pod = deployment["spec"]["template"]["spec"]
    assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert container["image"].endswith("-cuda")
    assert config["SPECSERVE_DEVICE"] == "cuda"
    assert config["SPECSERVE_DTYPE"] == "bfloat16"
    assert "Llama-3.2-3B" in config["SPECSERVE_MODEL"]
    assert "Llama-3.2-1B" in config["SPECSERVE_DRAFT_MODEL"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    models = next(n for n, v in volumes.items() if "persistentVolumeClaim" in v)
    claim = volumes[models]["persistentVolumeClaim"]["claimName"]
    _one(docs, "PersistentVolumeClaim", claim)
    mount_path = mounts[models]["mountPath"].rstrip("/") + "/"
    assert config["SPECSERVE_MODEL"].startswith(mount_path)
    assert config["SPECSERVE_DRAFT_MODEL"].startswith(mount_path)
    assert config["HF_HOME"].startswith(mount_path)


def test_example_secret_is_a_placeholder():
    (secret,) = yaml.safe_load_all((K8S / "examples" / "specserve-keys.example.yaml").read_text())
    assert secret["metadata"]["name"] == "specserve-keys"
    assert set(secret["stringData"]) == {"api-keys", "admin-key"}
    assert all("REPLACE-ME" in v for v in secret["stringData"].values())
