"""wanxport.gateway layer (see DESIGN.md section 2)."""
