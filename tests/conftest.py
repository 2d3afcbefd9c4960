"""Fixtures shared by every test folder.

`in_process_gateway` (a Gateway on a background loop, any config, the secure gates included) is
defined with the gates' tests and offered here to the client, security and other tests.
"""

from tests.gates.conftest import in_process_gateway  # noqa: F401 - re-exported as a shared fixture
