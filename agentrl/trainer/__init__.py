"""The trainer: from complete groups to an optimizer step and a published version."""
