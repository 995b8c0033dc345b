"""The local Kubernetes control plane: real etcd, kube-apiserver, controllers, scheduler, kwok."""
