"""Model families: causal LMs, classifiers, pretrained checkpoints, and their sizes."""
