"""vnet test guest tooling: see guest/README.md."""
