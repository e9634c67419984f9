"""The engine image: built and compared by identity (`image`), shipped to workers (`ship`), the patch series
(`patches`, standard library only: copied into the build context as the in-image applier)."""
