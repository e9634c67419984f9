"""The machines and the wire between them: this one and workers over ssh (`nodes`), the RoCE link (`link`), this
machine's ports (`ports`)."""
