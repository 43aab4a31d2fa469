"""Pooling policy sweeps: rounds pair across policies within a sweep, intervals widen with noise, mixed traffic
or hosts are refused."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from scipy import stats

from bench.common import cpu_model
from bench.sweep_pool import interval, load_rounds, summarize

ARGS = {"new_tokens": 48, "length_spread": 0.5, "requests_per_client": 4, "min_requests": 32,
        "device": "cpu", "dtype": "float32", "threads": 1}


def sweep(tmp_path: Path, name: str, rates: dict[str, list[float]], processor: str = "cpu A", **args) -> Path:
    rows = [{"workload": "code", "temperature": 0.0, "concurrency": 16, "policy": policy, "runs_tok_s": runs}
            for policy, runs in rates.items()]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"environment": {"processor": processor}, "args": {**ARGS, **args}, "rows": rows}))
    return path


def test_rounds_pool_across_sweeps_and_stay_paired(tmp_path: Path) -> None:
    first = sweep(tmp_path, "a", {"adaptive": [110, 100], "off": [100, 100], "ngram k=4": [120, 90]})
    second = sweep(tmp_path, "b", {"adaptive": [99], "off": [100], "draft k=2": [105], "off (twin)": [101]})
    (cell, rounds), = load_rounds([first, second]).items()
    assert cell == ("code", 0.0, 16)
    assert rounds == [{"adaptive": 110, "off": 100, "ngram k=4": 120}, {"adaptive": 100, "off": 100, "ngram k=4": 90},
                      {"adaptive": 99, "off": 100, "draft k=2": 105, "off (twin)": 101}]
    summary = summarize(cell, rounds, 0.95)
    assert summary["adaptive_vs_off"]["rounds"] == 3
    assert summary["adaptive_vs_off"]["mean"] == pytest.approx((1.1 * 1.0 * 0.99) ** (1 / 3))
    # draft k=2 ran one round only: no interval, so not the best fixed policy; ngram k=4's mean is 1.039
    assert summary["best_fixed"] == "ngram k=4"
    assert summary["adaptive_vs_best_fixed"]["mean"] == pytest.approx(math.sqrt(110 / 120 * 100 / 90))
    assert "off_twin_vs_off" not in summary  # one round of the twin is no interval either


def test_an_ab_sweeps_adaptive_variant_pools_as_no_fixed_policy(tmp_path: Path) -> None:
    """An A/B sweep's rounds add to adaptive's and off's (same code); its variant is never the best fixed policy."""
    ab = sweep(tmp_path, "ab", {"adaptive": [100, 100], "off": [100, 100], "ngram k=4": [90, 90],
                                "adaptive (some rule)": [130, 130]})
    (cell, rounds), = load_rounds([ab]).items()
    summary = summarize(cell, rounds, 0.95)
    assert summary["best_fixed"] == "ngram k=4"
    assert summary["adaptive_vs_off"]["rounds"] == 2


def test_interval_is_a_t_interval_of_the_log_ratios() -> None:
    logs = [0.01, -0.02, 0.03, 0.0]
    result = interval(logs, 0.95)
    mean, sd = sum(logs) / 4, (sum((x - sum(logs) / 4) ** 2 for x in logs) / 3) ** 0.5
    half = stats.t.ppf(0.975, 3) * sd / 2
    assert result == pytest.approx({"mean": math.exp(mean), "low": math.exp(mean - half),
                                    "high": math.exp(mean + half), "rounds": 4})
    assert interval(logs, 0.5)["high"] < result["high"]


def test_other_traffic_hosts_files_or_cells_without_a_fixed_policy_are_refused_clearly(tmp_path: Path) -> None:
    base = sweep(tmp_path, "a", {"adaptive": [1.0], "off": [1.0]})
    with pytest.raises(SystemExit, match="--new-tokens"):
        load_rounds([base, sweep(tmp_path, "b", {"adaptive": [1.0], "off": [1.0]}, new_tokens=96)])
    with pytest.raises(SystemExit, match="different hosts"):
        load_rounds([base, sweep(tmp_path, "c", {"adaptive": [1.0], "off": [1.0]}, processor="cpu B")])
    with pytest.raises(SystemExit, match="no fixed policy"):
        summarize(("code", 0.0, 16), [{"adaptive": 1.0, "off": 1.0}, {"adaptive": 1.1, "off": 1.0}], 0.95)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match="not a policy_sweep result"):
        load_rounds([other])


def test_a_host_is_named_by_its_cpus_kind_not_only_by_the_name_a_vm_gives_it(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nstepping\t: 1\n\n"
                       "processor\t: 1\ncpu family\t: 26\nmodel name\t: another\n")
    assert cpu_model(cpuinfo) == "AMD EPYC (cpu family 25, model 1, stepping 1)"  # the first processor's
    cpuinfo.write_text("model name\t: Some CPU\n")
    assert cpu_model(cpuinfo) == "Some CPU"
    assert cpu_model(tmp_path / "missing") == ""


def test_a_gzipped_sweep_pools_like_its_json(tmp_path: Path) -> None:
    plain = sweep(tmp_path, "a", {"adaptive": [110, 100], "off": [100, 100], "ngram k=4": [120, 90]})
    zipped = tmp_path / "a.json.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_rounds([zipped]) == load_rounds([plain])
    broken = tmp_path / "b.json.gz"
    broken.write_bytes(b"not gzip")
    with pytest.raises(SystemExit, match="not readable as JSON"):
        load_rounds([broken])
