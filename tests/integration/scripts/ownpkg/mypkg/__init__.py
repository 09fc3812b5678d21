"""The user's own package, beside the project that uses it (not under the script's folder)."""
