"""mixq's benchmarks: the real-model suite (``python -m bench --suite quick|full``, see
:mod:`bench.suite`) and single-purpose scripts (``formats_bench.py``, ``convert_bench.py``,
``calib_memory_bench.py``). Peer quantizers are imported only under this folder."""
