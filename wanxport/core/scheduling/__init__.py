"""The parts schedulers are composed of (``wanxport.core.scheduler``): path order, tail, stripes, hedging."""
