"""Kafka wire protocol, sans-IO: frames in, typed requests out; typed responses in, bytes out."""
