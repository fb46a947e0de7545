"""One request as every part sees it: its OpenAI parameters (:mod:`.params`), its token count and prefix
blocks (:mod:`.tokens`), and the project's request-trace format (:mod:`.trace`).
"""
