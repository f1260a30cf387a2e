"""The Triton kernels: the kernel A/B's baseline (``baseline``) and split-KV kernel (``splitkv``), and the SGLang
plugin's kernel where the Gluon ones cannot run (``ragged``: another GPU than sm_90, a logit cap). Their plan and merge
are the package's (``specdiag.kernels.plan``, ``specdiag.kernels.merge``)."""
