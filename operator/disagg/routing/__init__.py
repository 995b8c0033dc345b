"""The request-routing decisions the router and the fleet simulator share (pure): token
counting without a tokenizer, a prompt's blocks, cache-aware engine choice and
conditional disaggregation. Both import these; neither imports the other."""
