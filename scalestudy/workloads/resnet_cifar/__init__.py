"""The reference workload: ResNet-18 (CIFAR variant) on CIFAR-10 images: its model, its loader and
its entry (workload)."""
