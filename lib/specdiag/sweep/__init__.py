"""``specdiag sweep``: arms as data, one server at a time, each measured by a named measurement.

- ``arms.py``: the arms file (YAML) parsed into typed dataclasses (:class:`Arm`, :class:`Speculation`,
  :class:`ModelRecipe`, :class:`ArmsFile`), every mistake named with its key and fix before any server starts.
- ``settings.py``: a measurement's settings (the arms file's ``settings:`` and the command line's overrides) into its
  own settings dataclass, checked the same way.
- ``servers.py``: an arm's server command and environment (pure) and :func:`~specdiag.sweep.servers.serving`, which
  holds an arm's server for the length of a block (started, then always stopped; a running server, ``url``, as it is).
- ``registry.py``: the named measurements (``engine_ab``, ``kv_layout``, ``moe_batch1``, ``plugin_identity``), each a
  function of its step's package taking an :class:`~specdiag.sweep.job.ArmJob`, named by module (imported when asked).
- ``driver.py``: the sweep itself, the one loop for every arm (start, measure, stop, next; rows appended as measured;
  a time budget): ``specdiag sweep`` on a GPU host, and 09 and 10 in-process (``plan``, ``sweep_into``).
- ``merge.py``: a sweep's parts (run folders) joined into one (``specdiag merge``).
- ``cli.py``: the verbs' command lines (``python -m specdiag.sweep sweep|merge|models``).

The package sits below the steps and imports none; importing any of its modules loads no server code (a server's code
is imported when it starts), so a replayed notebook imports it freely.
"""
