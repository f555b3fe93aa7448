"""Who a client is and what it may do: listeners and their security protocols, TLS, SASL, the user store."""
