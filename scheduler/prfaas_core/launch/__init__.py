"""How the data-plane processes are launched: each engine's command, arguments and environment
(:mod:`.engines`), rendered from the custom resources (:mod:`.render`), and the emulators' time and
byte scale (:mod:`.emulation`).
"""
