"""inflight: a Triton Python-based backend that keeps the GPU busy for small models.

Importing the package needs neither a GPU, torch, nor the Triton stub: heavy modules are
imported lazily by the parts that need them.
"""

__version__ = "0.1.0"
