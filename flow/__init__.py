"""Flow control: who waits and who goes first when the replicas are saturated (pure, no Ray, no vLLM)."""
