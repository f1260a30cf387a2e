"""The warp-specialized Gluon kernels (CUDA sm_90): ``ws`` (row-major; its partitions, copies and barriers serve the
others), ``swap`` (the rows as the wgmma's N, up to 16 rows), ``fp8`` (an fp8 e4m3 cache), ``ragged`` (the SGLang
plugin's kernels on SGLang's layout) and ``pick`` (the kernel A/B's dense pick among them). Their plan and merge are
the package's (``specdiag.kernels.plan``, ``specdiag.kernels.merge``). The CPU tests compile them for sm_90."""
