"""The router's shared state and configuration: the config file and its compiled form (with the tokenizer), the
long-lived runtime (ledgers, breakers, books, the snapshot the hot path reads), the signals refresher that swaps
the snapshot, the metrics, the credentials, the calls between replicas, and what travels on the wire (HTTP
helpers, the engine legs' bodies, Server-Timing). Imports nothing of the router's other packages."""
