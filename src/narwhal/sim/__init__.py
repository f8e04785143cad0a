"""`narwhal sim`: a vLLM-faithful simulated inference engine with a performance model.

from narwhal.sim import SimOptions, start_sim

sim = await start_sim(SimOptions(time_scale=0.1), port=0)
...  # talk to sim.url
await sim.close()
"""

from narwhal.sim.options import SimOptions
from narwhal.sim.server import RunningSim, start_sim

__all__ = ["RunningSim", "SimOptions", "start_sim"]
