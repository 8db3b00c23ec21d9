"""The engine: requests, scheduling, the step loop, sampling."""
