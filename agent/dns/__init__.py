"""The agent's DNS proxy: mesh names from the control plane's name table (NDS), everything
else forwarded to the upstream resolvers."""
