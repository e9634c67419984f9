"""The checkpoint: the pinned download onto the head (`download`), manifests and the copy to workers
(`checkpoint`)."""
