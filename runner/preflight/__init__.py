"""Checks made before any rank starts: each refusal names the key, the value and the fix."""
