"""wanxport.aio layer (see DESIGN.md section 2)."""
