"""``sepa-gateway bench soak``: a gateway under steady load for minutes, sampled every minute."""
