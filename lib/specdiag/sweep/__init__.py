"""``specdiag sweep``: arms as data, one server at a time, each measured by a named measurement.

- ``arms.py``: the arms file (YAML) parsed into typed dataclasses (:class:`Arm`, :class:`Speculation`,
  :class:`ModelRecipe`, :class:`ArmsFile`), every mistake named with its key and fix before any server starts.
- ``settings.py``: a measurement's settings (the arms file's ``settings:`` and the command line's overrides) into its
  own settings dataclass, checked the same way.
- ``servers.py``: an arm's server command and environment (pure) and its :class:`~specdiag.process.ManagedServer`.
- ``registry.py``: the named measurements (``engine_ab``, ``kv_layout``, ``moe_batch1``, ``plugin_identity``), each a
  function of its step's package taking an :class:`~specdiag.sweep.job.ArmJob`.
- ``driver.py``: the sweep itself (start, measure, stop, next; rows appended as measured; a time budget).
- ``merge.py``: the parts of a sweep (its run folders) joined into one run (``specdiag merge``).
- ``cli.py``: the verbs' command lines (``python -m specdiag.sweep sweep|merge|models``).

Nothing here is imported by a replayed notebook: steps import only :mod:`specdiag.sweep.job` and
:mod:`specdiag.sweep.arms` (both pure).
"""
