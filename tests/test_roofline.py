"""The roofline: device profiles with a cited peak FLOP/s, time per call = max(bytes / BW, FLOPs / peak) with the
bound named, time to first token, prefill log runs against the compute roof, and the chart's axes."""

import math

import pytest

from analyzer.analysis.record import read_analysis_file
from analyzer.measure.logs import parse_logs, summarize
from analyzer.model.sources import DEFAULT_PRESET
from analyzer.predict.profiles import EXAMPLE_PROFILES, ProfileError, load_profiles, parse_profiles
from analyzer.predict.roofline import Roof, predict, predict_call, prefill_runs, time_to_first_token
from analyzer.report import roofline_figures as rf
from analyzer.report.catalog import SHIPPED_DIR, shipped_name

ROOF = Roof("test device", 100e9, 10e12)  # 100 GB/s, 10 TFLOP/s: ridge at 100 FLOP/byte
HEADER = ("key,device,unit,kind,bytes_per_s,source,url,read_on,note,flops_per_s,flops_kind,flops_source,flops_url\n")


def test_time_per_call_is_the_larger_of_the_two_roofs():
    memory = predict_call("decode", "decode", 1, 2_000_000_000, 4_000_000_000, ROOF)  # 2 FLOP/byte
    assert memory.bound == "memory" and memory.time_per_call_s == pytest.approx(0.02)
    assert memory.tok_per_s == pytest.approx(50.0) and memory.attainable_flops_per_s == pytest.approx(200e9)
    compute = predict_call("prefill", "prefill", 512, 2_000_000_000, 2_000_000_000_000, ROOF)  # 1,000 FLOP/byte
    assert compute.bound == "compute" and compute.time_per_call_s == pytest.approx(0.2)
    assert compute.tok_per_s == pytest.approx(2560.0) and compute.attainable_flops_per_s == pytest.approx(10e12)
    assert ROOF.ridge_flops_per_byte == pytest.approx(100.0)
    assert ROOF.attainable_flops_per_s(1.0) == 100e9 and ROOF.attainable_flops_per_s(1e6) == 10e12
    with pytest.raises(ValueError, match="flops_per_s must be a finite number > 0"):
        Roof("bad", 1e9, 0)


def test_time_to_first_token_counts_whole_calls():
    prefill = predict_call("p", "prefill", 64, 1_000_000_000, 1_000_000_000_000, ROOF)  # compute: 0.1 s per call
    decode = predict_call("d", "decode", 1, 1_000_000_000, 2_000_000_000, ROOF)  # memory: 0.01 s per token
    t = time_to_first_token(129, prefill, decode)
    assert (t.calls, t.seconds) == (3, pytest.approx(0.3))  # a padded third call costs a whole call
    assert "3 prefill call(s) of 64 tokens" in t.how and "compute-bound" in t.how
    t = time_to_first_token(129, None, decode)
    assert (t.calls, t.seconds) == (129, pytest.approx(1.29)) and "no prefill function" in t.how
    with pytest.raises(ValueError):
        time_to_first_token(10)


def test_shipped_decode_is_memory_bound_on_every_cited_roof():
    a = read_analysis_file(SHIPPED_DIR / shipped_name(DEFAULT_PRESET, "qfold", "state", 4096))
    for p in load_profiles().values():
        if p.has_compute_roof:
            call = predict(a, Roof.of(p))
            assert call.bound == "memory", p.key
            assert call.tok_per_s == pytest.approx(p.bytes_per_s / a.bytes_per_token.total)


def test_cited_profiles_carry_a_source_and_a_kind_for_each_figure():
    profiles = load_profiles()
    with_roof = {k: p for k, p in profiles.items() if p.has_compute_roof}
    assert {"m1-ane", "m3-ane", "m4-ane", "m5-ane"} <= set(with_roof)
    for p in with_roof.values():
        assert p.flops_source and p.flops_url.startswith("https://") and p.flops_kind in ("measured", "datasheet")
        if p.flops_kind == "datasheet":  # Apple's "operations per second": says what it is not
            assert "not" in p.flops_source and "fp16" in p.flops_source
    assert with_roof["m5-ane"].flops_kind == "measured" and with_roof["m5-ane"].flops_per_s == 17_990_000_000_000
    with pytest.raises(ProfileError, match="no peak FLOP/s"):
        Roof.of(profiles["writeup-ab-iphone"])
    assert "flops_per_s" in EXAMPLE_PROFILES.read_text().splitlines()[0]


@pytest.mark.parametrize(("cells", "match"), [
    ("12e12,measured,somewhere,", "column 'flops_per_s', value '12e12'"),
    ("12000000000000,guessed,somewhere,", "column 'flops_kind', value 'guessed'"),
    ("12000000000000,measured,,", "column 'flops_source': a peak FLOP/s figure needs its source"),
])
def test_bad_flops_cells_name_the_line_and_column(cells, match):
    text = HEADER + f"x,Dev,ANE,measured,1000,src,,,,{cells}\n"
    with pytest.raises(ProfileError, match=f"mine.csv:2, {match}" if "column" in match else match):
        parse_profiles(text, "mine.csv")


def test_a_profile_file_without_flops_columns_still_loads():
    old = "key,device,unit,kind,bytes_per_s,source,url,read_on,note\nx,Dev,ANE,measured,1000,src,,,\n"
    p = parse_profiles(old, "old.csv")["x"]
    assert p.flops_per_s is None and not p.has_compute_roof
    empty = parse_profiles(HEADER + "x,Dev,ANE,measured,1000,src,,,,,,,\n", "new.csv")["x"]
    assert empty.flops_per_s is None


def test_prefill_log_runs_are_held_against_the_compute_roof():
    a = read_analysis_file(SHIPPED_DIR / shipped_name(DEFAULT_PRESET, "qfold", "state", 4096))  # a decode analysis
    log = b"device,build,tok_per_s,phase,prompt_tokens\nM5,p,500,prefill,512\nM5,p,20,decode,\nM5,q,400,prefill,512\n"
    summaries = summarize(parse_logs([("log.csv", log)]).measurements, phase="prefill")
    runs = {r.build: r for r in prefill_runs(summaries, {"p": a, "q": None}, ROOF)}
    assert set(runs) == {"p", "q"}
    assert runs["q"].implied_flops_per_s is None and "no prefill analysis" in runs["q"].note
    assert runs["p"].implied_flops_per_s is None  # a decode analysis is not a prefill call: no figures
    frame = rf.prefill_runs_frame(tuple(runs.values()))
    assert list(frame.columns) == list(rf.PREFILL_RUN_COLUMNS) and frame["implied_flops_per_s"].isna().all()


def test_roofline_chart_has_log_axes_with_units_and_a_point_per_phase():
    a = read_analysis_file(SHIPPED_DIR / shipped_name(DEFAULT_PRESET, "repeat_kv", "state", 4096))
    b = read_analysis_file(SHIPPED_DIR / shipped_name(DEFAULT_PRESET, "qfold", "state", 4096))
    points = rf.phase_points("A", "repeat_kv", [a], ROOF) + rf.phase_points("B", "qfold", [b], ROOF)
    frame = rf.phase_frame(points)
    assert list(frame.columns) == list(rf.PHASE_COLUMNS)
    assert list(frame["kv_replication_tiles"]) == [60, 0] and set(frame["bound"]) == {"memory"}
    assert frame["flops_per_call"].iloc[0] == frame["flops_per_call"].iloc[1]  # repeat_kv adds copies, not FLOPs
    fig = rf.roofline_figure(frame, ROOF)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "FLOP per byte" in fig.layout.xaxis.title.text and "FLOP/s" in fig.layout.yaxis.title.text
    roof_trace = fig.data[0]
    assert max(roof_trace.y) == pytest.approx(ROOF.flops_per_s)
    ridge = next(t for t in fig.data if t.name == "ridge")  # drawn in data coordinates, not an annotation
    assert list(ridge.x) == pytest.approx([ROOF.ridge_flops_per_byte] * 2) and not fig.layout.annotations
    xs = [x for t in fig.data[1:] if t.name != "ridge" for x in t.x]
    assert xs == pytest.approx(list(frame["intensity_flops_per_byte"]))
    assert all(math.isfinite(y) for t in fig.data for y in t.y)
