"""Speculative decoding's own numbers, by concern: ``commit`` (commit lengths per request and per step, from a
server's reply), ``logs`` (SGLang's server log lines), ``scrapes`` (``/metrics`` text and the counters' deltas between
two scrapes).

Vocabulary (the same in every notebook):

- **verify step**: one target forward pass that checks a block of drafted tokens.
- **commit length**: tokens a verify step adds to the output, the bonus token included
  (SGLang's ``accept len`` / ``spec_accept_length``, DFlash's ``commit_len``, the DDTree lines'
  ``avg_commit_len``). Always >= 1.
- **accepted drafts** (``correct drafts``): commit length - 1.

Everything here is a pure function of its arguments: no I/O, no global state.
"""
