"""The custom resources' schema side: CRDs generated from the typed API (:mod:`.crds`), offline admission
as the API server does it (:mod:`.check`: OpenAPI schema + CEL), the engine-config checks
(:mod:`.engine_checks`) and manifest validation across objects (:mod:`.validation`).
"""
