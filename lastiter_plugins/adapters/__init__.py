"""Framework glue, installed as ``lastiter_plugins.adapters`` (never as a
top-level ``adapters`` module, a name taken by an unrelated PyPI package).

Packages, one per host: ``opacus`` (PrivacyEngine accountants), ``tf_privacy``
(Keras callback and privacy statement), ``dp_accounting`` (DpEvents and a
PrivacyAccountant). Each imports its host library lazily, so importing this
package needs none of them.
"""
