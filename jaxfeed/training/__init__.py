"""The training loop and what it stands on: `fit` (`loop`), the step contract
(`steps`), verified checkpoints (`checkpoint`), Ctrl-C and SIGTERM
(`interrupts`), the padding check (`padding_check`) and the progress lines
(`log`). The public names are re-exported by `jaxfeed` (``jaxfeed.fit``, ...)."""
