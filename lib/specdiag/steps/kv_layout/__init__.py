"""10_kv_layout: does the request's KV layout in the pool (fragmented against contiguous) cost verify time, and on
which kernel?

- :mod:`.filler`: the bounded workload that scatters a page_size-1 pool (loopback servers only);
- :mod:`.measure`: per arm (a server URL), a long request on a flushed pool and on a fragmented one, with its layout
  (the embedded server's meta_info, or the SGLang plugin's layout records);
- :mod:`.analysis`: fresh against fragmented, the kernel A/B's prediction, the findings (pure);
- :mod:`.tier0`: an arm beside its ``<arm>_contiguous`` arm (the contiguous KV allocator): fresh, scattered and
  contiguous after the same traffic, and whether the allocator buys the layout's cost back (pure);
- :mod:`.plots`: 10's figure.

The layout math itself (runs of consecutive slots) is :mod:`specdiag.kvlayout`, shared with the embedded server.
"""
