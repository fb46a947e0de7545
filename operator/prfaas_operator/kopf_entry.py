"""For ``kopf run -m prfaas_operator.kopf_entry``: registers the handlers on kopf's default registry; the
configuration then comes from the environment (see :meth:`OperatorConfig.from_env`)."""

import kopf

from .handlers import register

register(kopf.get_default_registry())
