"""C++ kernels that several mechanisms share, each with its Python wrapper.

:mod:`.feature_attention`: feature-map attention ``phi(q) . phi(k)`` (linear attention's ``elu + 1`` / ``relu``,
Fastmax's polynomial features, FAST eqs 24-27). Compiled with every op's own ``ops/<op>/*.cpp`` into the one
library of :mod:`attnzoo.ops._cpu_kernels`.
"""
