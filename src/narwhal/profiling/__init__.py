"""Profiling: the probe runs that measure each engine before it takes work and when it
changes (`runs`). A floor of its own above the engines it sends probes through, the
models it fits and installs, and the registry it reads load from: the engine clients
report values and never decide, and the models stay math over values."""
