"""wanxport.aio layer (see docs/design.md section 2)."""
