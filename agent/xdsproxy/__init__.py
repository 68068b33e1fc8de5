"""The agent's xDS proxy: one upstream channel, many relayed streams, ResponseHandlers."""
