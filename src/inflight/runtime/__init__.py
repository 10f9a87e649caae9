"""The backend runtime: engines, slots, runners and executors (loaded inside the Triton stub)."""
