"""`sparks top`: samples and snapshots (`top`), the Prometheus text it reads (`prometheus`), the terminal view
(`view`)."""
