"""High availability: one active router per fleet, elected through an etcd lease."""
