"""KIP-848's consumer group protocol: server-side assignors (assignors), a member and its reconciliation (member), a
group's epoch and target assignment (group), and ConsumerGroupHeartbeat's logic (heartbeat)."""
