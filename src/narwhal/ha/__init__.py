"""High availability: one active router per fleet, elected through an etcd lease; on
Kubernetes, the leader's label on its own pod, which the clients' Service selects."""
