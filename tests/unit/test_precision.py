"""Reduced precision: which CPUs multiply bfloat16 natively (from /proc/cpuinfo's text), what is refused where,
and the fidelity figures of a reduced-precision output against float32's."""

from __future__ import annotations

import numpy as np
import pytest

from bucketing.config import ConfigError, HandlerConfig
from bucketing.engines.precision import (
    Fidelity,
    check_cpu_dtype,
    cpu_flags,
    cpu_name,
    measure,
    native_bf16,
    order_changes,
)

SAPPHIRE_RAPIDS = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\n"
    "flags\t\t: fpu vme avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
    "vmx flags\t: vnmi preemption_timer\n\nprocessor\t: 1\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\n"
)
ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
MILAN = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_2 avx avx2 fma f16c\n"


def test_native_bfloat16_is_read_from_the_flags_lines():
    assert native_bf16(SAPPHIRE_RAPIDS) == "amx_bf16"
    assert native_bf16(ZEN4) == "avx512_bf16"
    assert native_bf16(MILAN) is None
    assert native_bf16("") is None  # no /proc/cpuinfo (not Linux)
    assert native_bf16("model name\t: amx_bf16 inside a name\nvmx flags\t: amx_bf16\n") is None  # only `flags`
    assert {"amx_tile", "fpu", "avx512_bf16"} <= cpu_flags(SAPPHIRE_RAPIDS)


def test_the_cpu_a_figure_is_named_beside():
    named = "model name\t: Intel(R) Xeon(R) Platinum 8480+\n" + SAPPHIRE_RAPIDS
    assert cpu_name(named) == "Intel(R) Xeon(R) Platinum 8480+, amx_bf16 avx512_bf16"
    assert cpu_name("model name\t: AMD EPYC 7B13\n" + MILAN) == "AMD EPYC 7B13, no native bfloat16"
    assert cpu_name("") == "unknown CPU, no native bfloat16"


def test_what_the_cpu_refuses():
    for cpu in (SAPPHIRE_RAPIDS, MILAN, ""):
        check_cpu_dtype("float32", cpu)  # float32 everywhere
    check_cpu_dtype("bfloat16", SAPPHIRE_RAPIDS)
    check_cpu_dtype("bfloat16", ZEN4)
    with pytest.raises(ConfigError, match=r"^handler.dtype: got 'bfloat16' on a CPU without native bfloat16 .*"):
        check_cpu_dtype("bfloat16", MILAN)
    with pytest.raises(ConfigError) as refused:
        check_cpu_dtype("bfloat16", MILAN)
    assert "would emulate it, slower than float32" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="handler.dtype: got 'float16' on the CPU"):
        check_cpu_dtype("float16", SAPPHIRE_RAPIDS)


def test_min_cosine_is_a_fraction_defaulting_to_0_999():
    assert HandlerConfig().min_cosine == 0.999 and HandlerConfig().dtype == "float32"
    assert HandlerConfig.from_mapping({"min_cosine": 1}).min_cosine == 1.0
    with pytest.raises(ConfigError, match=r"handler.min_cosine: got 1.5; allowed: a number from 0 to 1"):
        HandlerConfig.from_mapping({"min_cosine": 1.5})


def test_embedding_fidelity_figures():
    ref = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    same = measure("bfloat16", ref, ref.copy())
    assert same == Fidelity("bfloat16", 3, 1.0, 1.0, 0.0)
    got = np.array([[1.0, 1.0], [0.0, 3.0], [3.0, 4.0]])  # first row 45 degrees off; second only longer
    fid = measure("bfloat16", ref, got)
    assert fid.cosine_min == pytest.approx(np.sqrt(0.5)) and fid.cosine_mean == pytest.approx((np.sqrt(0.5) + 2) / 3)
    assert fid.max_abs_diff == pytest.approx(np.sqrt(0.5))  # on unit vectors, as answered: (1, 0) - (.71, .71)
    assert fid.changed is None
    assert fid.describe() == (
        "bfloat16 fidelity vs float32 on 3 probe texts: cosine min 0.707107 mean 0.902369, max abs diff 7.1e-01"
    )


def test_a_worker_below_min_cosine_is_refused_naming_the_figure():
    fid = Fidelity("bfloat16", 16, 0.99871, 0.9995, 3e-3)
    assert fid.refusal(0.998) is None
    assert fid.refusal(0.999) == (
        "handler.dtype bfloat16: cosine min 0.998710 to float32 on 16 probe texts is below handler.min_cosine "
        "0.999; use dtype float32, or lower min_cosine knowingly"
    )


def test_the_fidelity_names_the_kind_of_probe_input_it_is_worst_on():
    ref = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
    got = np.array([[1.0, 0.01], [0.3, 1.0], [3.0, 4.0]])
    fid = measure("bfloat16", ref, got, kinds=("prose", "digits", "scripts"))
    assert fid.worst == "digits" and "cosine min 0.957826 (on digits) mean" in fid.describe()
    assert str(fid.refusal(0.99)).startswith("handler.dtype bfloat16: cosine min 0.957826 (on digits) to float32 on 3 ")


def test_classifier_fidelity_counts_changed_top_labels_and_ties():
    ref = np.array([[2.0, 0.0], [0.0, 0.01], [1.0, -1.0]])
    got = np.array([[2.0, 0.0], [0.01, 0.0], [1.0, -1.0]])  # the near-tie of row 1 flips
    fid = measure("bfloat16", ref, got, True, "identity")
    assert (fid.changed, fid.compared, fid.ties) == (1, 3, 1)
    assert fid.max_abs_diff == pytest.approx(0.01)
    assert fid.describe().endswith(", 1 of 3 top labels/orders changed (1 within the error)")


def test_reranker_fidelity_counts_flipped_pairs():
    ref = np.array([[0.9], [0.5], [0.51], [0.1]])
    got = np.array([[0.9], [0.52], [0.5], [0.1]])
    assert order_changes(ref, got, 0.02) == (1, 6, 1)  # 6 pairs; (1, 2) flips, 0.01 apart in float32
    assert order_changes(ref, ref, 0.0) == (0, 6, 0)
    fid = measure("bfloat16", ref, got, True, "sigmoid")
    assert 0.99 < fid.cosine_min < 1.0 and fid.changed == 1  # the scores' correlation across the texts


def test_a_reranker_whose_scores_move_is_refused():
    """One logit a row: a row's own cosine is only its sign (always 1 here), so the gate compares the scores across
    the texts (their centred cosine): a reranker whose order moves is refused under min_cosine."""
    ref = np.array([[2.0], [-1.0], [0.5], [0.4]])
    got = np.array([[0.9], [-0.1], [0.3], [0.6]])
    fid = measure("bfloat16", ref, got, True, "identity")
    assert fid.cosine_min < 0.95 and fid.changed == 1
    assert fid.refusal(0.999) is not None and fid.refusal(0.9) is None
