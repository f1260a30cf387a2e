"""A page leads with its answer and says what its numbers describe: 09's and 10's answer lines on the recorded H200
runs, "acceptance forced" wherever a forced commit becomes a number, the banner of a demo and of a replay, the run
index's answer and where each notebook's numbers come from, a long log folded."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import nbformat
import pytest

from specdiag import subject
from specdiag.paths import REFERENCE_DIR
from specdiag.section import Section, lead_html

matplotlib.use("Agg")

DFLASH = REFERENCE_DIR / "sglang-h200-mla61-dflash"
TIER0 = REFERENCE_DIR / "sglang-h200-kv-tier0"


@pytest.fixture(scope="module")
def dflash_page(tmp_path_factory: pytest.TempPathFactory):
    from specdiag.steps.engine_ab import page

    return page, page.start({"replay_dir": str(DFLASH), "run_dir": str(tmp_path_factory.mktemp("09") / "run")})


def test_09_answers_which_configuration_as_its_answer_says_and_that_acceptance_was_forced(dflash_page) -> None:
    page, pg = dflash_page
    lines = dict(page.lead_lines(pg))
    assert list(lines) == ["Symptom", "Run", "Buys", "Speculation", "How sure"]
    # the one answer (steps.engine_ab.answer), said as 09's finding says it: the first token weighed against decode
    assert lines["Run"] == pg.answer.numbers["answer"] and "flashinfer" in lines["Run"]
    assert "(acceptance forced)" in lines["Run"]
    assert "acceptance forced to 4 (SGLANG_SIMULATE_ACC_LEN)" in lines["How sure"]
    assert lines["Buys"].startswith("The plugin makes a verify step 165x faster at 128k tokens")
    assert page.metrics(pg)["lead"] == [list(x) for x in page.lead_lines(pg)]
    assert page.metrics(pg)["forced_acceptance"]["triton_plugin"] == 4.0 and "triton_nospec" not in pg.forced


def test_09_captions_and_columns_of_tokens_per_second_say_acceptance_was_forced(dflash_page) -> None:
    page, pg = dflash_page
    decode = page.decode(pg)
    fig = next(p for k, p in decode.parts if k == "figure")
    assert "acceptance forced to 4 (SGLANG_SIMULATE_ACC_LEN)" in fig.axes[1].get_title()
    details = next(p for k, p in decode.parts if k == "html")
    assert "decode tok/s (median, computed, acceptance forced)" in details
    settings = next(p for k, p in page.arms(pg).parts if k == "table").to_html()
    assert "forced to 4" in settings and "SGLANG_SIMULATE_ACC_LEN set on the arm&#x27;s server" in settings.replace(
        "'", "&#x27;")


def test_10_answers_turn_the_contiguous_allocator_on_in_a_sentence(tmp_path: Path) -> None:
    from specdiag.steps.kv_layout import page

    pg = page.start({"replay_dir": str(TIER0), "run_dir": str(tmp_path / "run")})
    said = page.contiguous_answer(pg.found)
    assert said.startswith("Turn the contiguous allocator on? Not established on plugin and plugin61: too few requests "
                           "on a scattered pool")
    assert "With it on, a verify step cost no more than +" in said and "on plugin61 against fresh" in said
    lead = page.lead(pg)
    assert lead.data["lead"][0] == ["Answer", said.removeprefix("Turn the contiguous allocator on? ")]
    assert "<div style=\"font-size:118%;font-weight:700;margin-bottom:4px\">Turn the contiguous allocator on?" \
        in lead.parts[0][1]


def test_the_lead_box_escapes_its_lines() -> None:
    box = lead_html([("Run", "a < b & c")], title="T")
    assert "a &lt; b &amp; c" in box and 'class="specdiag-lead"' in box
    assert Section().lead([("Run", "x")]).data["lead"] == [["Run", "x"]]


def test_the_banner_says_demo_replay_or_nothing() -> None:
    demo = subject.banner({"engine": {"engine": "embedded"}, "hardware": {"device_name": "host CPU (x86_64)"}})
    assert demo is not None and demo.kind == "demo" and "describe that toy" in demo.text
    assert "make report SERVER=" in demo.text and "host CPU (x86_64)" in demo.text
    replay = subject.banner({"replay_of": "data/reference/sglang-h200-kv-tier0"})
    assert replay is not None and replay.kind == "recorded" and "1 x H200" in replay.title  # the reference index
    # a notebook of a live run showing a reference (06 without CUDA): recorded, and kept apart from the run's
    apart = subject.banner({"engine": {"engine": "embedded"}}, {"device": {"gpu": "NVIDIA H200"}},
                           REFERENCE_DIR / "kernel-ab-h200")
    assert apart is not None and apart.kind == "recorded" and "kept apart" in apart.text
    assert subject.banner({"server": {"device": "cuda", "version": "0.5.17"}}) is None
    # a reference whose run.json names no GPU is named by its line in data/reference/README.md
    assert "H200" in (subject.hardware_of({}, REFERENCE_DIR / "sglang-h200-mla2-plugin-traced") or "")
    assert subject.banner_html(None) == "" and "&lt;" in subject.banner_html(subject.Banner("demo", "<", "x"))


def test_the_run_index_opens_with_the_answer_and_says_where_each_row_was_measured(tmp_path: Path) -> None:
    from specdiag.findings import Finding
    from specdiag.report.execute import NotebookResult
    from specdiag.report.index import write_run_index
    from specdiag.report.render import collect_results
    from specdiag.runs import Run

    run = Run.create(tmp_path / "run", server_url="http://127.0.0.1:1", engine={"engine": "embedded"},
                     hardware={"device_name": "host CPU (x86_64)"})
    run.write_result("06_kernel_ab", [Finding("kernel_ab.x", "X", "x", "info")],
                     metrics={"copy_gbps": 4248.0}, recorded_from="data/reference/kernel-ab-h200")
    run.write_result("09_engine_ab", [Finding("engine_ab.y", "Y", "y", "info")],
                     metrics={"step_ms": 1.0, "forced_acceptance": {"a": 4.0}, "lead": [["Run", "a"]]})
    run.write_result("07_findings", [Finding("findings.diagnosis", "Diagnosis", "a long paragraph " * 40, "critical")],
                     metrics={"lead": [["Symptom", "decode falls"], ["Run", "the plugin"]], "diagnosis": "long"})
    results = [NotebookResult(n, "ok", 1.0, html=f"html/{n}.html") for n in ("06_kernel_ab", "09_engine_ab",
                                                                            "07_findings")]
    collect_results(run, results)
    page = write_run_index(run, results).read_text()
    assert page.index("Demo run: a tiny model on a CPU") < page.index("The answer") < page.index("<table class=\"notebooks")
    assert "<th>Symptom</th><td>decode falls</td>" in page and 'href="html/07_findings.html"' in page
    row_06, row_09 = page.split(">06_kernel_ab<", 1)[1], page.split(">09_engine_ab<", 1)[1]
    assert "recorded on NVIDIA H200 (data/reference/kernel-ab-h200), not on this run&#39;s machine" in row_06
    assert "measured on host CPU (x86_64)" in row_09 and "acceptance forced to 4 (SGLANG_SIMULATE_ACC_LEN)" in row_09
    assert "<code>lead</code>" not in page and "<code>diagnosis</code>" not in page
    # a verdict is folded under its title: 07's long diagnosis no longer fills the table
    assert "<details><summary>[CRITICAL] Diagnosis</summary>" in page


def test_a_long_log_is_folded_under_its_first_line() -> None:
    """A log printed line by line (one output a line, as a sweep prints it) is one log, folded; a short print apart
    from it stays as it is."""
    from specdiag.report.outputs import LOG_LINES_SHOWN, fold_long_logs

    book = nbformat.v4.new_notebook()
    lines = [nbformat.v4.new_output("stream", name="stdout", text=f"arm measuring {i}\n")
             for i in range(LOG_LINES_SHOWN + 5)]
    cell = nbformat.v4.new_code_cell("x", outputs=[*lines, nbformat.v4.new_output("display_data", data={"text/html": "x"}),
                                                   nbformat.v4.new_output("stream", name="stdout", text="short\n")])
    book.cells = [cell]
    fold_long_logs(book)
    folded, shown, short = cell.outputs
    assert folded.output_type == "display_data" and shown.data["text/html"] == "x" and short.text == "short\n"
    html = folded.data["text/html"]
    assert html.startswith('<details class="specdiag-log"><summary') and "arm measuring 0" in html
    assert f"({LOG_LINES_SHOWN + 5} lines of log)" in html and "arm measuring 16" in html


def test_07s_answer_on_a_run_of_09s_arms_alone_takes_09s_symptom_and_what_it_buys() -> None:
    """A run that measured only 09 (no 01 sweep, no fix beside a stock server): 07's symptom and "buys" lines say what
    09 said, marked as 09's, not "no decode speed was measured" and "not measured"."""
    from specdiag.steps.findings.diagnosis import Diagnosis
    from specdiag.steps.findings.lead import lead_lines

    d = Diagnosis(slow="", floor="", cause="", fix="")
    results = {"09_engine_ab": {"metrics": {"lead": [["Symptom", "Prefill is 2.36x its floor at 128k tokens (x)"],
                                                     ["Run", "Run y at 128k"], ["Buys", "y is as fast as flashinfer"]]}}}
    lines = dict(lead_lines(d, [], results))
    assert lines["Symptom"] == "Prefill is 2.36x its floor at 128k tokens (x) (09)"
    assert lines["Buys"] == "y is as fast as flashinfer (09)" and lines["Run"] == "Run y at 128k (09)"
    bare = dict(lead_lines(d, [], {}))
    assert bare["Symptom"] == "no decode speed was measured in this run" and bare["Buys"].startswith("not measured")
