"""The dashboard's logic without Streamlit (issue #16): units chosen per value, headline cards, the report's
waterfall at long labels, apples-to-apples, log-label auto-mapping, the one bandwidth setting, messages without
command-line flags, the package zip and the full-size rebuild of a build."""

from __future__ import annotations

import io
import re
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer import fmt
from analyzer.analysis.accounting import BytesPerToken
from analyzer.analysis.record import load_analysis
from analyzer.compare.diff import diff_analyses
from analyzer.convert.compress import canonical_spec
from analyzer.convert.rebuild import full_size_spec
from analyzer.errors import QfoldError
from analyzer.measure.logs import parse_logs
from analyzer.model.cost import check_request
from analyzer.model.sources import AttentionGeometry, load_config, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec
from analyzer.predict.fit import bandwidth_report
from analyzer.predict.profiles import DEFAULT_PROFILE, load_profiles
from analyzer.report import figures, report
from analyzer.report.bandwidth_setting import BandwidthSetting, BandwidthSettingError, resolve
from analyzer.report.catalog import AnalysisRef, RefFacts, load_shipped, matching_pair
from analyzer.report.compare import compare, structure_caveat
from analyzer.report.graphview.layout import parse_layer
from analyzer.report.headline import ABHeadline, ab_headline, headline_cards
from analyzer.report.labels import match_log_label
from analyzer.report.messages import for_ui
from tests.synthetic import build_info, decode_analysis

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


# ---------------------------------------------------------------------------------------------- units
@pytest.mark.parametrize(("n_bytes", "ladder", "unit"), [
    (0, "auto", "B"), (1023, "auto", "B"), (1024, "auto", "KiB"), (32_768, "auto", "KiB"),
    (960 * MIB, "auto", "MiB"), (3 * 2**30, "auto", "GiB"), (-1_920 * MIB, "auto", "GiB"),
    (999, "auto-si", "B"), (2_013_265_920, "auto-si", "GB"), (61_440, "auto-si", "kB"),
])
def test_pick_unit_per_value(n_bytes, ladder, unit):
    assert fmt.pick_unit(n_bytes, ladder) == unit


def test_sizes_read_in_their_own_unit_and_never_as_minus_zero():
    assert fmt.size(32_768, "auto", None) == "32.0 KiB"  # the 32 KiB of tiles, not "0 MiB"
    assert fmt.size(960 * MIB, "auto", None) == "960 MiB"
    assert fmt.size(3_174_671_528, "auto", None) == "2.96 GiB"
    assert fmt.size(-2_013_265_920, "auto-si", None, sign=True) == "-2.01 GB"
    assert fmt.change(32_768, 0, "auto", None) == "32.0 → 0 KiB"
    assert fmt.change(960 * MIB, 512 * 1024, "auto", None) == "960 MiB → 512 KiB"
    assert fmt.size(-100, "MiB") == "0.0 MiB" and fmt.size(-100, "MiB", sign=True) == "0.0 MiB"
    assert fmt.pick_unit(4.9e9, "auto", at_least=100) == "MiB"  # a table column: its largest value ≥ 100


@pytest.mark.parametrize(("tok_per_s", "text"), [(365_455.02, "365,455"), (1_204.63, "1,205"), (48.13, "48.1"),
                                                 (5.432, "5.43"), (0.1254, "0.125")])
def test_rates_have_separators_and_sensible_decimals(tok_per_s, text):
    assert fmt.rate(tok_per_s) == text


def test_csv_floats_without_binary_noise():
    text = fmt.to_csv([{"a": 0.1 + 0.2, "b": 55_900 / 20.39, "c": -0.0, "d": float("nan"), "e": 3, "f": "=x"}],
                      list("abcdef"))
    assert text.splitlines()[1] == "0.3,2741.53997057,0,,3,'=x"


# ---------------------------------------------------------------------------------------------- headline
def _bytes(total: int) -> BytesPerToken:
    return BytesPerToken(total, 0, 0, 0, 0, 0)


def _headline(tiles=(4, 4), tile_bytes=(32_768, 0), totals=(3_000_000, 2_967_232), bw=55.9e9) -> ABHeadline:
    a, b = _bytes(totals[0]), _bytes(totals[1])
    return ABHeadline("A", "B", tiles[0], tiles[1], tile_bytes[0], tile_bytes[1], 100, 100, 50, 50, a, b, bw,
                      bw / totals[0], bw / totals[1])


def test_headline_cards_pick_the_unit_per_value_and_leave_no_change_neutral():
    cards = {c.key: c for c in headline_cards(_headline())}
    assert cards["tile_bytes"].value == "32.0 → 0 KiB" and cards["tile_bytes"].delta == "-32.0 KiB"
    assert cards["tiles"].value == "4 → 4"
    assert (cards["tiles"].delta, cards["tiles"].delta_color, cards["tiles"].delta_arrow) == ("no change", "off", "off")
    assert cards["ops"].delta == "no change"
    assert cards["bytes"].value == "2.86 → 2.83 MiB" and cards["bytes"].delta_color == "inverse"
    assert cards["tok_per_s"].value == "18,633 → 18,839"  # separators, no spurious decimals


def test_headline_card_ratios_say_which_way():
    slower = {c.key: c for c in headline_cards(_headline(totals=(1_000_000, 3_000_000)))}["tok_per_s"]
    assert slower.delta.startswith("×0.33") and slower.delta_arrow == "down" and slower.delta_color == "inverse"
    same = {c.key: c for c in headline_cards(_headline(totals=(1_000_000, 1_000_000)))}["tok_per_s"]
    assert same.delta == "×1.00, no change" and same.delta_arrow == "off" and same.delta_color == "off"


def test_headline_cards_of_the_shipped_default_pair():
    a, b = load_shipped("repeat_kv"), load_shipped("qfold")
    cards = {c.key: c for c in headline_cards(ab_headline(a, b, bw_bytes_per_s=55.9e9),
                                              measured=(20.39, 54.3, "iPhone"))}
    assert cards["tiles"].value == "60 → 0" and cards["tile_bytes"].value == "960 → 0 MiB"
    assert cards["bytes"].value.endswith(" GiB") and "decimal units" in cards["bytes"].help
    assert cards["measured"].value == "20.39 → 54.30" and cards["measured"].delta == "×2.66 measured"


# ---------------------------------------------------------------------------------------------- waterfall
LONG = ("repeat_kv (shipped): exaone-4.0-1.2b · repeat_kv · ctx 4096 · top8 · full size · KV state · shipped "
        "and a folder name nobody would shorten")


def _line_lengths(text: str) -> list[int]:
    return [len(line) for line in text.split("<br>")]


@pytest.mark.parametrize("labels", [("A", "B"), ("repeat_kv (shipped)", "qfold (shipped)"), (LONG, LONG + " (B)")])
def test_waterfall_layout_stays_readable_at_any_label_length(labels):
    a, b = decode_analysis("repeat_kv", 30), decode_analysis("qfold", 30)
    fig = figures.waterfall_figure(figures.category_frame(diff_analyses(a, b)), *labels)
    layout, (trace,) = fig.layout, fig.data
    lines = [n for name in trace.y for n in _line_lengths(name)]
    assert max(lines) <= figures.LABEL_WRAP_CHARS
    assert all(len(name.split("<br>")) <= figures.LABEL_MAX_LINES for name in trace.y)
    # the labels sit in a left margin sized to them, and the plot keeps most of the figure
    assert layout.margin.l >= max(lines) * figures.LABEL_CHAR_PX
    assert layout.margin.l + layout.margin.r <= 260  # ≥ 440 px of bars in a 700 px report column
    assert layout.height == figures.WATERFALL_HEIGHT_PX
    assert layout.height - layout.margin.t - layout.margin.b >= 300  # the plot was squeezed to ~70 px
    title = layout.title.text
    assert max(_line_lengths(title)) <= figures.TITLE_WRAP_CHARS and len(title.split("<br>")) <= 2
    assert layout.margin.t >= 30 + figures.TITLE_LINE_PX * len(title.split("<br>"))  # the title is not clipped
    assert trace.orientation == "h" and layout.yaxis.autorange == "reversed"  # A's total on top


def test_report_headline_prints_separators_and_the_cards():
    a, b = decode_analysis("repeat_kv", 2), decode_analysis("qfold", 2)
    html = report.build_report(a, b, label_a=LONG, label_b=LONG, bw_bytes_per_s=55.9e12)
    kpis = html[html.index("<div class='kpis'>"):html.index("<h2>Headline</h2>")]
    assert not re.search(r"\d{4,}\.\d", kpis)  # no "1204.63 → 365455.02"
    assert re.search(r"\d{1,3}(,\d{3})+ → \d{1,3}(,\d{3})+", kpis)


# ---------------------------------------------------------------------------------------------- apples to apples
def _with(analysis, **spec_changes):
    info = analysis.build
    geometry = spec_changes.pop("geometry", info.geometry)
    return replace(analysis, build=replace(info, spec=replace(info.spec, **spec_changes), geometry=geometry))


def test_an_ab_that_changes_only_the_variant_is_comparable():
    a, b = decode_analysis("repeat_kv", 2), decode_analysis("qfold", 2)
    assert compare(a, b).comparable and compare(a, b).sentence() == ""


def test_differences_besides_the_variant_are_named():
    a, b = decode_analysis("repeat_kv", 2), decode_analysis("qfold", 2)
    qwen = resolve_source("qwen3-0.6b", ("hidden_size=256", "vocab_size=1000", "num_hidden_layers=2"))
    other = _with(b, source=qwen, ctx=256, kv_mode="input", compression=canonical_spec("top8", 2),
                  geometry=AttentionGeometry("qwen3", 2, 16, 8, 128, 256, 1000), build_mode="analysis")
    diffs = {d.aspect: (d.a, d.b) for d in compare(a, other).differences}
    assert diffs == {"model": ("exaone-4.0-1.2b (exaone4)", "qwen3-0.6b (qwen3)"),
                     "geometry": ("2 layers, 32/8 heads, head_dim 64", "2 layers, 16/8 heads, head_dim 128"),
                     "ctx": ("4096", "256"), "KV mode": ("state", "input"), "compression": ("fp16", "top8"),
                     "build mode": ("materialised", "analysis")}
    sentence = compare(a, other).sentence()
    assert sentence.startswith("A and B differ in model (exaone-4.0-1.2b (exaone4) vs qwen3-0.6b (qwen3))")


def test_a_package_made_elsewhere_cannot_be_checked_and_says_so():
    a, b = decode_analysis("repeat_kv", 2), decode_analysis("qfold", 2, with_build=False)
    c = compare(a, b)
    assert c.unknown == ("B",) and not c.comparable and "cannot check" in c.sentence()


def test_structure_builds_carry_a_caveat_on_predicted_speed():
    tiny = resolve_source("exaone-4.0-1.2b", ("hidden_size=256", "intermediate_size=512", "vocab_size=1000"))
    a = _with(decode_analysis("repeat_kv", 2), source=tiny)
    assert "A is a structure build" in structure_caveat(a, load_shipped("qfold"))
    assert structure_caveat(load_shipped("repeat_kv"), load_shipped("qfold")) is None


# ---------------------------------------------------------------------------------------------- log labels
def _ref(kind, model, variant, ctx=4096, compression="fp16", size="full size", model_type=None, key=None):
    ident = f"{kind}:{key or f'{model}-{variant}-{ctx}-{compression}-{size}'}"
    facts = RefFacts(model, variant, ctx, "state", compression, size, model_type)
    return AnalysisRef(ident, kind, facts.label(), Path("/x") / ident, variant, facts=facts,
                       spec=(("source", model), ("ctx", ctx), ("compression", compression), ("size", size)))


REFS = [
    _ref("shipped", "exaone-4.0-1.2b", "repeat_kv", model_type="exaone4"),
    _ref("shipped", "exaone-4.0-1.2b", "qfold", model_type="exaone4"),
    _ref("shipped", "exaone-4.0-1.2b", "repeat_kv", compression="top8", model_type="exaone4"),
    _ref("shipped", "exaone-4.0-1.2b", "qfold", compression="top8", model_type="exaone4"),
    _ref("build", "exaone-4.0-1.2b", "qfold", ctx=256, size="2 layers, structure", key="exa-tiny-qfold"),
    _ref("build", "qwen2.5-0.5b", "qfold", ctx=256, size="2 layers, structure", model_type="qwen2"),
    _ref("build", "qwen3-0.6b", "qfold", ctx=512, model_type="qwen3"),
    _ref("build", "llama-3.2-1b", "qfold", ctx=2048, model_type="llama"),
    _ref("build", "llama-3.2-1b", "qfold", ctx=4096, model_type="llama"),
]
BY_ID = {r.id: r for r in REFS}


@pytest.mark.parametrize(("label", "contexts", "expected", "reason"), [
    # the write-up's log: model + variant + compression
    ("exaone-repeat_kv-top8", (), ("exaone-4.0-1.2b", "repeat_kv", 4096, "top8"), "names exaone-4.0-1.2b"),
    ("EXAONE4 qfold fp16", (), ("exaone-4.0-1.2b", "qfold", 4096, "fp16"), "names"),
    # a label naming no compression is fp16; the runs' ctx picks the tiny build over the shipped one
    ("exaone-qfold", (256,), ("exaone-4.0-1.2b", "qfold", 256, "fp16"), "names"),
    ("exaone-qfold", (), ("exaone-4.0-1.2b", "qfold", 4096, "fp16"), "names"),
    ("qwen3-0.6b-qfold", (), ("qwen3-0.6b", "qfold", 512, "fp16"), "names"),
    ("llama-qfold-ctx2048", (), ("llama-3.2-1b", "qfold", 2048, "fp16"), "ctx 2048"),
    # never "the default pair": a model qfold has no analysis of, or one it cannot tell, stays unmapped
    ("mistral-qfold", (), None, "names no model"),
    ("qwen-qfold", (), None, "fits 2 models (qwen2.5-0.5b, qwen3-0.6b)"),
    ("llama-qfold", (), None, "2 analyses fit"),
    ("exaone-top8-device-table", (), None, "names no variant"),
    ("exaone-repeat_kv-vs-qfold", (), None, "names 2 variants"),
    ("exaone-qfold-base-top8", (), None, "2 compressions"),
    ("exaone-repeat_kv-top12", (), None, "no analysis of exaone-4.0-1.2b · repeat_kv · top12"),
    ("myqfold-exaone", (), None, "names no variant"),
    ("exa-tiny-qfold", (), ("exaone-4.0-1.2b", "qfold", 256, "fp16"), "build's key"),
])
def test_log_labels_map_by_what_they_name(label, contexts, expected, reason):
    match = match_log_label(label, REFS, frozenset(contexts))
    assert reason in match.reason
    if expected is None:
        assert match.ref_id is None
    else:
        f = BY_ID[match.ref_id].facts
        assert (f.model, f.variant, f.ctx, f.compression) == expected


def test_matching_pair_finds_the_other_variant_of_the_same_spec():
    base = _ref("build", "m", "repeat_kv", key="m-r")
    cand = _ref("build", "m", "qfold", key="m-q")
    other = _ref("build", "m", "qfold", ctx=256, key="m-q-256")
    assert matching_pair(cand, [base, cand, other]) == (base, cand)
    assert matching_pair(other, [base, cand, other]) is None


def test_matching_pair_prefers_the_twin_of_the_same_build_mode():
    """An analysis-mode and a materialised repeat_kv of one spec share the A/B's spec fields; a materialised
    Q-fold pairs with the materialised one wherever the two sit in the list (CI found the first one taken)."""
    cand = _ref("build", "m", "qfold", key="m-q")
    materialised = _ref("build", "m", "repeat_kv", key="m-r")
    analysis = _ref("build", "m", "repeat_kv", key="m-r-analysis")
    analysis = AnalysisRef(analysis.id, analysis.kind, analysis.label, analysis.path, analysis.variant,
                           spec=analysis.spec, facts=replace(analysis.facts, build_mode=ANALYSIS_MODE))
    assert matching_pair(cand, [analysis, materialised, cand]) == (materialised, cand)
    assert matching_pair(cand, [analysis, cand]) == (analysis, cand)  # no twin of its mode: the other one


def test_matching_pair_prefers_a_decode_build_to_a_decode_prefill_builds_decode_function():
    """A decode+prefill build's decode function shares a decode build's A/B fields; a decode Q-fold build pairs
    with the decode repeat_kv build wherever the two sit in the list (CI found the decode function taken), and a
    decode+prefill function with its own kind."""
    cand = _ref("build", "m", "qfold", key="m-q")
    decode = _ref("build", "m", "repeat_kv", key="m-r")
    both = _ref("build", "m", "repeat_kv", key="m-r-dp")
    both = AnalysisRef(both.id + "#decode", both.kind, both.label, both.path, both.variant, spec=both.spec,
                       facts=replace(both.facts, phase="decode+prefill: decode", q_len=64))
    assert matching_pair(cand, [both, decode, cand]) == (decode, cand)
    assert matching_pair(cand, [both, cand]) == (both, cand)  # no decode build: the decode function
    cand_both = AnalysisRef(cand.id + "-dp#decode", cand.kind, cand.label, cand.path, cand.variant, spec=cand.spec,
                            facts=replace(cand.facts, phase="decode+prefill: decode", q_len=64))
    assert matching_pair(cand_both, [decode, both, cand_both]) == (both, cand_both)


# ---------------------------------------------------------------------------------------------- bandwidth
def test_bandwidth_setting_round_trips_and_refuses_bad_text():
    profiles = load_profiles()
    for setting in (BandwidthSetting(), BandwidthSetting("typed", typed_mb_per_s=123.5),
                    BandwidthSetting("profile", profile_key="m1-ane"), BandwidthSetting("fitted")):
        assert BandwidthSetting.from_text(setting.to_text(), profiles) == setting
    assert BandwidthSetting("typed", typed_mb_per_s=55_900.0).to_text() == "typed:55900"
    for bad in ("profile:nope", "typed:abc", "typed:nan", "typed:0", "typed:1e30", "guess", "fitted:x"):
        with pytest.raises(BandwidthSettingError):
            BandwidthSetting.from_text(bad, profiles)


def test_one_setting_resolves_to_one_bandwidth():
    profiles = load_profiles()
    typed = resolve(BandwidthSetting("typed", typed_mb_per_s=111_800.0), profiles)
    assert typed.bytes_per_s == typed.fixed_bytes_per_s == 111_800e6 and typed.label == "111,800 MB/s"
    default = resolve(BandwidthSetting(), profiles)
    assert default.bytes_per_s == profiles[DEFAULT_PROFILE].bytes_per_s == 55_900e6 and "assumed" in default.source
    # fitted on the write-up's log with the shipped top8 pair's graph bytes: one device, one fit
    log = REPO / "examples" / "writeup_device_logs.csv"
    measurements = parse_logs([(log.name, log.read_bytes())]).measurements
    graph = {f"exaone-{v}-top8": load_analysis(REPO / "analyzer" / "shipped" /
                                               f"exaone-4.0-1.2b-{v}-state-ctx4096-top8.analysis.json")
             .bytes_per_token.total for v in ("repeat_kv", "qfold")}
    fits = bandwidth_report(measurements, graph).fits
    fitted = resolve(BandwidthSetting("fitted"), profiles, fits, prefer_device=fits[0].device)
    assert fitted.fixed_bytes_per_s is None and fitted.bytes_per_s == fits[0].bw_bytes_per_s
    assert fitted.source.startswith(f"fitted on {fits[0].device}")
    nothing = resolve(BandwidthSetting("fitted"), profiles, ())
    assert nothing.bytes_per_s == 55_900e6 and "no usable fit" in nothing.source


# ---------------------------------------------------------------------------------------------- messages
def _errors() -> list[str]:
    out = []
    for call in (lambda: resolve_source("/nonexistent/model"), lambda: resolve_source("exaone-4.0-1.2b", ("x",)),
                 lambda: BuildSpec(resolve_source("exaone-4.0-1.2b"), "qfold", "state", 0),
                 lambda: check_request(load_config(resolve_source("exaone-4.0-1.2b")), 131_072),
                 lambda: parse_layer("x")):
        with pytest.raises(QfoldError) as e:
            call()
        out.append(str(e.value))
    return out


def test_page_messages_carry_no_command_line_flags():
    messages = _errors()
    assert all("--" in m for m in messages)  # the CLI's wording, which pages must not show
    shown = [for_ui(m) for m in messages]
    assert not any(re.search(r"(?<![\w-])--[a-z]", m) for m in shown), shown
    assert shown[0].startswith("'/nonexistent/model': not a preset")
    assert shown[2].startswith("context length 0: must be a positive integer")
    assert shown[3].endswith("(choose a context length within it)")


# ---------------------------------------------------------------------------------------------- packages
def test_zip_leaves_symlinks_out(tmp_path):
    pkg = tmp_path / "model.mlpackage"
    (pkg / "Data").mkdir(parents=True)
    (pkg / "Manifest.json").write_text("{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of the package")
    (pkg / "Data" / "link.txt").symlink_to(secret)
    (pkg / "linked_dir").symlink_to(tmp_path)
    with zipfile.ZipFile(io.BytesIO(report.zip_package(pkg, "x.mlpackage"))) as zf:
        assert zf.namelist() == ["x.mlpackage/Manifest.json"]
    assert report.package_size_bytes(pkg) == 2
    # the command the Export page gives for a large package leaves them out too (python -m zipfile followed them)
    zip_name = "x.mlpackage.zip"
    command = report.zip_command(pkg, zip_name).replace(f" /tmp/{zip_name}", f" {tmp_path}/{zip_name}")
    done = subprocess.run(command, shell=True, capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(tmp_path / "x.mlpackage.zip") as zf:
        assert zf.namelist() == ["x.mlpackage/Manifest.json"]
    assert subprocess.run(command, shell=True, capture_output=True).returncode != 0  # never overwrites


@pytest.mark.conversion
def test_a_zipped_build_unzips_to_a_package_inspect_reads(tiny_builds, tmp_path):
    package = tiny_builds["qfold"] / "model.mlpackage"
    expected = load_analysis(package)
    with zipfile.ZipFile(io.BytesIO(report.zip_package(package, "tiny-qfold.mlpackage"))) as zf:
        zf.extractall(tmp_path / "ui")
    assert load_analysis(tmp_path / "ui" / "tiny-qfold.mlpackage").summary == expected.summary
    # the command the page gives for a package too large to download makes the same package
    command = report.zip_command(package, "big.mlpackage.zip").replace(" /tmp/big", f" {tmp_path}/big")
    subprocess.run(command, shell=True, check=True)
    with zipfile.ZipFile(tmp_path / "big.mlpackage.zip") as zf:
        zf.extractall(tmp_path / "cli")
    assert load_analysis(tmp_path / "cli" / "big.mlpackage").summary == expected.summary


# ---------------------------------------------------------------------------------------------- rebuild
def test_full_size_spec_drops_the_shrinking_overrides_and_keeps_the_rest():
    info = build_info("qfold", 2, ctx=256, compression=canonical_spec("top8", 2))
    spec = full_size_spec(replace(info.spec, kv_mode="input"))
    assert spec.source.overrides == () and spec.source.label == "exaone-4.0-1.2b"
    assert (spec.variant, spec.kv_mode, spec.ctx) == ("qfold", "input", 256)
    assert spec.compression == canonical_spec("top8", 30)  # the preset, for the full model's 30 layers


def test_full_size_spec_of_an_upload_that_is_gone_says_why():
    info = build_info("qfold", 2)
    gone = replace(info.spec.source, kind="config", ref="/tmp/qfold-upload-gone/config.json", label="my-llama")
    with pytest.raises(QfoldError, match="no longer on this server; upload it again"):
        full_size_spec(replace(info.spec, source=gone))
