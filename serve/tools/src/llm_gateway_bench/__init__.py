"""`llm-gateway-bench`: the gateway against the simulator, direct and through it."""
