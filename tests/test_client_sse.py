"""Unit tests for the client's pure parts: SSE parsing, stream-mode detection, trace assembly."""

from __future__ import annotations

import json

import pytest

from specdiag.serving.errors import error_message_from_body as _error_message_from_body
from specdiag.serving.sse import DONE, SSEDecoder, SSEFormatError, parse_sse_lines
from specdiag.serving.trace import assemble_stream, detect_stream_mode

# Three chunks of a speculative stream: 1 prefill token, then steps committing 3 and 2 tokens.
IDS = [[11], [12, 13, 14], [15, 16]]
TEXTS = [["a "], ["b ", "c ", "d "], ["e ", "f\u2028g "]]  # U+2028 must not split a line


def _meta(ct: int, final: bool) -> dict:
    meta = {"id": "r1", "prompt_tokens": 7, "completion_tokens": ct, "finish_reason": None, "cached_tokens": 0}
    if final:
        meta.update(
            finish_reason={"type": "length", "length": ct},
            spec_verify_ct=2,
            spec_accept_length=ct / 2,
            spec_num_correct_drafts=3,
            spec_num_proposed_drafts=14,
            spec_correct_drafts_histogram=[0, 1, 1, 0, 0, 0, 0, 0],
        )
    return meta


def chunks(incremental: bool) -> list[dict]:
    out, ids, text = [], [], ""
    for i, (new_ids, new_text) in enumerate(zip(IDS, TEXTS)):
        ids = ids + new_ids
        text = text + "".join(new_text)
        out.append(
            {
                "text": "".join(new_text) if incremental else text,
                "output_ids": new_ids if incremental else ids,
                "meta_info": _meta(len(ids), i == len(IDS) - 1),
            }
        )
    return out


def sse_bytes(events: list[dict | str]) -> bytes:
    """Encode as SGLang does: b"data: " + json + b"\\n\\n", then data: [DONE]."""
    body = b"".join(b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in events)
    return body + b"data: [DONE]\n\n"


FULL_TEXT = "a b c d e f\u2028g "
FULL_IDS = [11, 12, 13, 14, 15, 16]


def test_parse_sse_lines_bytes_and_str() -> None:
    lines = sse_bytes(chunks(False)).split(b"\n")
    events = list(parse_sse_lines(lines))
    assert events[-1] == DONE
    assert [e["meta_info"]["completion_tokens"] for e in events[:-1]] == [1, 4, 6]
    assert events[2]["text"] == FULL_TEXT  # U+2028 kept inside the JSON string
    str_events = list(parse_sse_lines(line.decode() for line in lines))
    assert str_events == events


def test_parse_sse_lines_skips_comments_fields_and_tolerates_missing_blank_lines() -> None:
    lines = [": keep-alive", "event: message", "id: 3", 'data: {"a": 1}', 'data: {"b": 2}', "", "data:[DONE]"]
    # two data lines without a blank line between them: each is a JSON object of its own
    assert list(parse_sse_lines(lines)) == [{"a": 1}, {"b": 2}, DONE]
    # with line endings still attached, and a CRLF
    assert list(parse_sse_lines(['data: {"x": 1}\r\n', "\r\n"])) == [{"x": 1}]


def test_parse_sse_lines_multiline_json_is_one_event() -> None:
    assert list(parse_sse_lines(["data: {", 'data: "k": 1}', ""])) == [{"k": 1}]


def test_parse_sse_lines_rejects_non_json() -> None:
    with pytest.raises(SSEFormatError, match="not JSON"):
        list(parse_sse_lines(["data: <html>502 Bad Gateway</html>", ""]))


def test_sse_decoder_handles_arbitrary_splits() -> None:
    raw = sse_bytes(chunks(True))
    for size in (1, 2, 7, 64, len(raw)):
        dec = SSEDecoder()
        events = []
        for i in range(0, len(raw), size):
            events.extend(dec.feed(raw[i : i + size]))
        leftover, partial = dec.close()
        assert leftover == [] and partial == b""
        assert events[-1] == DONE and len(events) == 4


def test_sse_decoder_close_reports_unfinished_line() -> None:
    dec = SSEDecoder()
    assert dec.feed(b'data: {"text": "a"}\n\ndata: {"text": "cu') == [{"text": "a"}]
    events, partial = dec.close()
    assert events == [] and partial == b'data: {"text": "cu'
    dec = SSEDecoder()
    dec.feed(b'data: {"text": "a"}')  # complete JSON, only the blank line missing
    assert dec.close() == ([{"text": "a"}], b"")


@pytest.mark.parametrize("incremental", [False, True])
def test_detect_stream_mode(incremental: bool) -> None:
    expected = "incremental" if incremental else "cumulative"
    assert detect_stream_mode(chunks(incremental)) == expected
    # without output_ids the text decides
    no_ids = [{k: v for k, v in c.items() if k != "output_ids"} for c in chunks(incremental)]
    assert detect_stream_mode(no_ids) == expected


def test_detect_stream_mode_single_chunk_is_cumulative() -> None:
    assert detect_stream_mode(chunks(False)[-1:]) == "cumulative"


@pytest.mark.parametrize("incremental", [False, True])
def test_assemble_stream_reconstructs_text_ids_and_tokens_per_chunk(incremental: bool) -> None:
    events = list(parse_sse_lines(sse_bytes(chunks(incremental)).split(b"\n")))
    timed = list(zip([0.5, 0.6, 0.75, 0.76], events))
    trace = assemble_stream(timed, "http://h:1/generate", 1000.0, 0.76)
    assert trace.stream_mode == ("incremental" if incremental else "cumulative")
    assert trace.text == FULL_TEXT
    assert trace.output_ids == FULL_IDS
    assert trace.chunk_tokens == [1, 3, 2]
    assert trace.chunk_t_s == [0.5, 0.6, 0.75]
    assert trace.ttft_s == 0.5
    assert trace.completion_tokens == 6 and trace.prompt_tokens == 7
    assert trace.e2e_s == 0.76 and trace.t_send_unix_s == 1000.0
    assert trace.finish_reason == {"type": "length", "length": 6}
    assert trace.spec is not None and trace.spec.verify_ct == 2 and trace.spec.num_correct_drafts == 3
    assert trace.spec.correct_drafts_histogram == [0, 1, 1, 0, 0, 0, 0, 0]
    assert trace.meta_info["spec_verify_ct"] == 2
    assert trace.n_chunks == 3 and trace.error is None


def test_assemble_stream_skips_chunks_without_new_tokens_and_error_chunks() -> None:
    c = chunks(False)
    repeat = json.loads(json.dumps(c[1]))  # same completion_tokens again (e.g. a text-only flush)
    events = [(0.1, c[0]), (0.2, c[1]), (0.25, repeat), (0.3, {"error": {"message": "boom"}}), (0.4, c[2]), (0.5, DONE)]
    trace = assemble_stream(events, "http://h:1/generate", 0.0, 0.5)
    assert trace.chunk_tokens == [1, 3, 2] and trace.chunk_t_s == [0.1, 0.2, 0.4]
    assert trace.output_ids == FULL_IDS


def test_assemble_stream_empty() -> None:
    trace = assemble_stream([], "http://u:p@h:1/generate", 5.0, None)
    assert trace.ttft_s is None and trace.chunk_t_s == [] and trace.completion_tokens == 0
    assert trace.spec is None and trace.meta_info == {} and trace.stream_mode is None
    assert "u:p@" not in trace.url  # a password in the URL never reaches a trace


def test_tokens_from_completion_tokens_not_from_ids() -> None:
    # stream_interval > 1 or coalesced deltas: one chunk carries several tokens; only
    # meta_info.completion_tokens says how many, even if output_ids were missing.
    c = [
        {"text": "abc", "meta_info": {"completion_tokens": 3}},
        {"text": "abcdef", "meta_info": {"completion_tokens": 7}},
    ]
    trace = assemble_stream([(0.1, c[0]), (0.2, c[1])], "http://h:1/generate", 0.0, 0.2)
    assert trace.chunk_tokens == [3, 4] and trace.completion_tokens == 7 and trace.text == "abcdef"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"error": {"message": "bad key", "type": "invalid_request_error", "code": 400}}', "bad key"),
        ('{"error": "plain"}', "plain"),
        ('{"detail": "Not Found"}', "Not Found"),
        ('{"detail": [{"loc": ["body", "text"], "msg": "field required"}]}', "body.text: field required"),
        ('{"object": "error", "message": "openai style", "code": 400}', "openai style"),
        ("Internal Server Error", "Internal Server Error"),
        ("", "(empty body)"),
    ],
)
def test_error_message_from_body(body: str, message: str) -> None:
    assert _error_message_from_body(body) == message
